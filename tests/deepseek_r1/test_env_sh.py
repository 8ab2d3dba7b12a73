"""llm_rl/deepseek_r1/env.sh, sourced by ray_start.sh on every node and by the launcher: VLLM_USE_V1=1 only on the
vLLM 0.13 bases (0.6.0, 0.7.1). vLLM 0.23 (verl 0.9.1, the default) has no such variable; env.sh exported it on
every base, before the base was even resolved (issue 61, item 3)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

DEEPSEEK = Path(__file__).resolve().parents[2] / "llm_rl" / "deepseek_r1"


@pytest.mark.parametrize("base,want", [("0.6.0", "1"), ("0.7.1", "1"), ("0.9.1", "unset")])
def test_env_sh_exports_vllm_use_v1_on_the_vllm_0_13_bases_only(base, want):
    script = (
        f'set -u; LAUNCH_ENV=(); source "{DEEPSEEK / "env.sh"}"; VERL_BASE={base}; '
        "if declare -F recipes_base_env >/dev/null; then recipes_base_env; fi; "
        'echo "${VLLM_USE_V1-unset}"; printf "%s\\n" "${LAUNCH_ENV[@]}"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == want, (base, out)
    assert ("VLLM_USE_V1" in out[1:]) == (want == "1"), (base, out)


@pytest.mark.parametrize("script", ["ray_start.sh", "run_deepseek_r1_a3.sh"])
def test_each_script_sets_the_base_environment_once_the_base_is_resolved(script):
    text = (DEEPSEEK / script).read_text()
    resolved = text.index('eval "$resolved"')
    call = re.search(r"^recipes_base_env\b", text, re.M)
    assert call and call.start() > resolved, (
        f"{script} does not call env.sh's recipes_base_env after resolving"
    )
