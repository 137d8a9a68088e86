"""Every accelerate config loads with accelerate's own reader, is coherent, and picks the launcher
its name says; the configs the docs and compare-parallelism name are exactly those shipped."""

import re
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from transformers.models.gpt2 import modeling_gpt2

from bench.compare_parallelism import STRATEGY_SPECS

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "accelerate_configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
MAX_KEYS = 8  # minimal: the launcher fills in everything else


def intended(path: Path) -> tuple[DistributedType, int, bool]:
    """What a config's name says it is for: the launcher it names (fsdp, deepspeed, ddp or
    multi: several processes), two machines for multi_node, the CPU for cpu_*."""
    name = path.stem
    if "fsdp" in name:
        distributed_type = DistributedType.FSDP
    elif "deepspeed" in name:
        distributed_type = DistributedType.DEEPSPEED
    elif "ddp" in name or "multi" in name:
        distributed_type = DistributedType.MULTI_GPU
    else:
        distributed_type = DistributedType.NO
    return distributed_type, 2 if name == "multi_node" else 1, name.startswith("cpu")


def test_the_configs_the_docs_and_compare_parallelism_name_are_those_shipped():
    texts = [path.read_text() for path in (REPO_ROOT / "README.md", *REPO_ROOT.glob("*/*.md"))]
    named = {
        name
        for text in texts
        for name in re.findall(r"accelerate_configs/([a-z0-9_]+\.yaml)", text)
    }
    named |= {name for spec in STRATEGY_SPECS.values() for name in spec.accelerate_configs or ()}
    assert named == {path.name for path in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_config_loads_and_is_coherent(path):
    config = load_config_from_file(str(path))
    distributed_type, num_machines, on_cpu = intended(path)
    assert config.distributed_type == distributed_type
    assert config.num_machines == num_machines
    assert config.use_cpu is on_cpu
    # Precision is stated once, here: fp32 on CPU, bf16 on GPUs (fp16 by command-line override).
    assert config.mixed_precision == ("no" if on_cpu else "bf16")
    if distributed_type == DistributedType.NO:
        assert config.num_processes == 1
    else:
        assert config.num_processes >= max(2, num_machines)
    if distributed_type == DistributedType.FSDP:
        wrapped = config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"]
        assert hasattr(modeling_gpt2, wrapped), f"{wrapped} is not a GPT-2 module"
        assert config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
        assert config.fsdp_config["fsdp_version"] == 2
    if distributed_type == DistributedType.DEEPSPEED:
        zero_stage = config.deepspeed_config["zero_stage"]
        assert path.stem.endswith(f"zero{zero_stage}")
        # ZeRO-3 keeps only shards unless told to gather them: final/ would not load.
        assert config.deepspeed_config.get("zero3_save_16bit_model", False) is (zero_stage == 3)
        # Trainer fills these from its own arguments; set here they could disagree.
        assert not {"gradient_accumulation_steps", "gradient_clipping"} & set(
            config.deepspeed_config
        )
    if num_machines > 1:
        assert config.rdzv_backend == "static" and config.main_process_port


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_config_is_minimal_and_commented(path):
    text = path.read_text()
    assert len(yaml.safe_load(text)) <= MAX_KEYS
    assert text.startswith("#") and "launch-pretraining" in text


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_launcher_accepts_config_and_picks_its_launcher(path):
    arguments = launch_command_parser().parse_args(["--config_file", str(path), "pretrain/run.py"])
    arguments, _, _ = _validate_launch_command(arguments)
    distributed_type, _, _ = intended(path)
    assert arguments.multi_gpu is (distributed_type == DistributedType.MULTI_GPU)
    assert arguments.use_fsdp is (distributed_type == DistributedType.FSDP)
    assert arguments.use_deepspeed is (distributed_type == DistributedType.DEEPSPEED)
    assert arguments.mixed_precision == load_config_from_file(str(path)).mixed_precision
