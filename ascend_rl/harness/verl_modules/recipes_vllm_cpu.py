"""A vLLM general plugin for the verl 0.9.1 CPU runs: keep each linear layer's weight where a weight update finds it.

vLLM's CPU build pre-packs linear weights for oneDNN and drops `layer.weight` when it can
(vllm/model_executor/layers/utils.py, `remove_weight=True` where `ops._supports_onednn`). verl 0.9.1's weight update
then loads a [128, 128] tensor into a zero-size parameter at the first sync and the run hangs; keeping the weight but
not re-packing would let vLLM sample from the initial weights without a word. With oneDNN's path off, vLLM uses
torch's own linear on `layer.weight`, which the sync updates in place.

Installed at the root of a verl 0.9.1 CPU tree (the CPU overlay, cpu-0014), with the `vllm` dist-info record whose
entry point names it (group vllm.general_plugins): vLLM loads general plugins in every process it starts (the
engine core, each worker) before it builds the model. It imports nothing of verl, so the engine does not pay
verl's start-up for it.
"""


def keep_linear_weights() -> None:
    """vLLM's general-plugin entry point: turn oneDNN's weight pre-packing off in this process."""
    import vllm._custom_ops as ops

    ops._supports_onednn = False
