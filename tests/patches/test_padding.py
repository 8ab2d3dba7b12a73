"""The NPU padding helpers that patch shared-0001 points verl at, against a plain reference.

verl/workers/roles/utils/padding.py (patched) takes pad_input/unpad_input from
verl.utils.npu_utils; the installed verl is the same 0.6.0 release, so its npu_utils is
exercised directly and the patched padding.py is loaded with the NPU branch selected.
"""

from __future__ import annotations

import ast
import subprocess
import types
from pathlib import Path

import pytest
import torch
from verl.utils import npu_utils

PADDING_PY = "verl/workers/roles/utils/padding.py"
PATCH = "patches/verl/shared-0001-npu-padding-helpers.patch"


def reference_unpad(x: torch.Tensor, mask: torch.Tensor):
    """Row-major loop over the mask: kept rows, flat indices, cu_seqlens, max length."""
    batch, seqlen = mask.shape
    rows, indices, lengths = [], [], []
    for i in range(batch):
        for j in range(seqlen):
            if mask[i, j]:
                rows.append(x[i, j])
                indices.append(i * seqlen + j)
        lengths.append(int(mask[i].sum()))
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    kept = torch.stack(rows) if rows else x.new_zeros((0, *x.shape[2:]))
    return kept, torch.tensor(indices, dtype=torch.long), torch.tensor(cu, dtype=torch.int32), max(lengths)


def _masks(batch: int, seqlen: int, gen: torch.Generator) -> torch.Tensor:
    """Left-padded, right-padded and scattered rows, with one all-padding and one full row."""
    mask = torch.zeros(batch, seqlen, dtype=torch.int64)
    for i in range(batch):
        kind = i % 4
        n = int(torch.randint(1, seqlen + 1, (1,), generator=gen))
        if kind == 0:
            mask[i, seqlen - n :] = 1
        elif kind == 1:
            mask[i, :n] = 1
        elif kind == 2:
            mask[i] = (torch.rand(seqlen, generator=gen) > 0.5).long()
        else:
            mask[i] = 1
    mask[0] = 0  # an all-padding row
    mask[-1] = 1  # a full row
    return mask


# hidden_states carry at least one feature dim (the flash-attn contract; padding.py unsqueezes ids)
SHAPES = [(2, 1, (1,)), (4, 7, (3,)), (5, 16, (1,)), (8, 33, (2, 5)), (3, 128, (16,))]


@pytest.mark.parametrize(("batch", "seqlen", "trailing"), SHAPES)
def test_unpad_then_pad_matches_reference(batch: int, seqlen: int, trailing: tuple) -> None:
    gen = torch.Generator().manual_seed(batch * 1000 + seqlen)
    x = torch.randn(batch, seqlen, *trailing, generator=gen)
    mask = _masks(batch, seqlen, gen)

    kept, indices, cu_seqlens, max_seqlen, used = npu_utils.unpad_input(x, mask)
    ref_kept, ref_indices, ref_cu, ref_max = reference_unpad(x, mask)

    assert torch.equal(kept, ref_kept)
    assert torch.equal(indices, ref_indices)
    assert cu_seqlens.dtype == torch.int32 and torch.equal(cu_seqlens, ref_cu)
    assert max_seqlen == ref_max
    assert torch.equal(used, mask.sum(-1).to(torch.int32))

    restored = npu_utils.pad_input(kept, indices, batch, seqlen)
    keep = mask.bool().reshape(batch, seqlen, *([1] * len(trailing)))
    assert restored.shape == x.shape
    assert torch.equal(restored, torch.where(keep, x, torch.zeros_like(x)))
    assert not restored[0].any(), "the all-padding row must come back as zeros"
    assert torch.equal(restored[-1], x[-1]), "the full row must come back unchanged"


def test_unpad_gradient_reaches_only_kept_positions() -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, 9, 3, generator=gen, requires_grad=True)
    mask = _masks(4, 9, gen)
    kept, indices, *_ = npu_utils.unpad_input(x, mask)
    npu_utils.pad_input(kept * 2.0, indices, 4, 9).sum().backward()
    assert torch.equal(x.grad, 2.0 * mask.unsqueeze(-1).expand_as(x).to(x.dtype))


def test_installed_npu_utils_is_the_sdist_copy(pristine_verl: Path) -> None:
    installed = Path(npu_utils.__file__).read_bytes()
    assert installed == (pristine_verl / "verl/utils/npu_utils.py").read_bytes()


def _load_padding_on_npu(tree: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Execute a tree's padding.py as if on an NPU host (CUDA absent, NPU present)."""
    import verl.utils.device as device

    monkeypatch.setattr(device, "is_cuda_available", False)
    monkeypatch.setattr(device, "is_npu_available", True)
    module = types.ModuleType("padding_under_test")
    source = (tree / PADDING_PY).read_text()
    exec(compile(source, str(tree / PADDING_PY), "exec"), module.__dict__)
    return module


def test_unpatched_padding_fails_on_npu(verl_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImportError, match="pad_input"):
        _load_padding_on_npu(verl_tree, monkeypatch)


def test_patched_padding_round_trips_on_npu(repo_root: Path, verl_tree: Path, monkeypatch) -> None:
    subprocess.run(["patch", "-p1", "-s", "-i", str(repo_root / PATCH)], cwd=verl_tree, check=True)
    tree = ast.parse((verl_tree / PADDING_PY).read_text())
    sources = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "transformers.integrations.npu_flash_attention" not in sources
    assert "verl.utils.npu_utils" in sources

    from tensordict import TensorDict

    padding = _load_padding_on_npu(verl_tree, monkeypatch)
    assert padding.pad_input is npu_utils.pad_input and padding.unpad_input is npu_utils.unpad_input

    # left-padded prompts (width 5) followed by right-padded responses (width 4)
    prompt_lens, response_lens = [5, 2, 3, 1], [4, 1, 2, 4]
    batch, p, r = len(prompt_lens), 5, 4
    attention = torch.zeros(batch, p + r, dtype=torch.int64)
    response_mask = torch.zeros(batch, r, dtype=torch.int64)
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        attention[i, p - pl : p + rl] = 1
        response_mask[i, :rl] = 1
    input_ids = torch.randint(1, 1000, (batch, p + r), generator=torch.Generator().manual_seed(3)) * attention
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    data = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention,
            "response_mask": response_mask,
            "position_ids": position_ids,
        },
        batch_size=[batch],
    )

    data = padding.left_right_2_no_padding(data)
    nested = data["input_ids"]
    for i in range(batch):
        assert torch.equal(nested[i], input_ids[i][attention[i].bool()])
        loss_mask = data["loss_mask"][i]
        assert int(loss_mask.sum()) == response_lens[i] and bool(loss_mask[-response_lens[i] :].all())

    values = padding.no_padding_2_padding(nested.to(torch.float32), data)
    assert torch.equal(values, input_ids[:, -r - 1 : -1].to(torch.float32))
