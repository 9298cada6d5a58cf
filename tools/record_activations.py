#!/usr/bin/env python3
"""Record a PyTorch model's intermediate outputs into a safetensors file.

Used to check a hand port layer by layer (docs/PORTING.md): record here, record the Rust
model's activations under the same names (torchport_burn::Activations or
torchport_candle::Activations), then compare the two files in recording order with
`tools/compare_activations.py` (or `torchport diff` where your build has it).

Every submodule that produces a tensor gets a forward hook; its output is stored as float32
under the module's qualified name (`features.0`, `bn1`, `encoder.layers.1.self_attn`). A module
called more than once is stored as NAME, NAME#2, NAME#3... The model's inputs are stored as
`input` (`input.1`, ... for more) and its output as `output`. The order in which modules
finished is written to the file's metadata as `torchport.order` (comma-separated), so a
comparison can report the first layer that diverges.

Command line
    python tools/record_activations.py MODEL_FILE.py:ClassName WEIGHTS.pt OUT.safetensors \
        --input INPUTS.safetensors:input [--input X.npy ...] [--layers conv1,bn1] [--leaves]
    MODEL_FILE.py:ClassName   a Python file and the nn.Module class in it, built with no
                              arguments (use --init '{"d": 4}' for keyword arguments)
    WEIGHTS.pt                a state_dict saved with torch.save (optionally under --key)
    --input FILE[:NAME]       an input tensor, from .npy or a named tensor of a safetensors file
    --layers a,b              record only these modules (default: every module but the root)
    --leaves                  record only modules without children

As a library
    from record_activations import record
    record(model, (x,), "torch_acts.safetensors")
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    if isinstance(out, dict):
        for o in out.values():
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def record(model: torch.nn.Module, inputs, path, layers=None, leaves=False) -> list[str]:
    """Run `model(*inputs)` in eval mode under no_grad, store every selected module's output
    in `path`; returns the names in recording order."""
    model.eval()
    tensors: dict[str, torch.Tensor] = {}
    order: list[str] = []
    wanted = set(layers) if layers else None

    def hook_for(name):
        def hook(_module, _args, out):
            t = _first_tensor(out)
            if t is None:
                return
            key, n = name, 1
            while key in tensors:
                n += 1
                key = f"{name}#{n}"
            tensors[key] = t.detach().to(torch.float32).contiguous().clone()
            order.append(key)

        return hook

    handles = []
    for name, module in model.named_modules():
        if name == "" or (wanted is not None and name not in wanted):
            continue
        if leaves and any(True for _ in module.children()):
            continue
        handles.append(module.register_forward_hook(hook_for(name)))
    try:
        with torch.no_grad():
            out = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    names = ["input"] + [f"input.{i}" for i in range(1, len(inputs))]
    for n, x in zip(names, inputs):
        if x.is_floating_point():
            tensors[n] = x.detach().to(torch.float32).contiguous()
    final = _first_tensor(out)
    if final is not None:
        tensors["output"] = final.detach().to(torch.float32).contiguous()
        order.append("output")
    recorded = [n for n in names if n in tensors] + order
    save_file(tensors, str(path), metadata={"torchport.order": ",".join(recorded),
                                            "producer": "record_activations.py"})
    return recorded


def _load_class(spec: str):
    file, _, cls = spec.rpartition(":")
    if not file or not cls:
        sys.exit(f"error: {spec!r} is not FILE.py:ClassName")
    mod_spec = importlib.util.spec_from_file_location(Path(file).stem, file)
    if mod_spec is None or mod_spec.loader is None:
        sys.exit(f"error: cannot import {file}")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module
    mod_spec.loader.exec_module(module)
    try:
        return getattr(module, cls)
    except AttributeError:
        sys.exit(f"error: {file} has no class {cls}")


def _load_input(spec: str) -> torch.Tensor:
    file, sep, name = spec.partition(":")
    if file.endswith(".npy"):
        return torch.from_numpy(np.load(file))
    if file.endswith(".safetensors"):
        tensors = load_file(file)
        key = name if sep else "input"
        if key not in tensors:
            sys.exit(f"error: {file} has no tensor {key!r} (it has {', '.join(sorted(tensors))})")
        return tensors[key]
    sys.exit(f"error: {file}: inputs are read from .npy or .safetensors files")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="FILE.py:ClassName")
    p.add_argument("weights", help="state_dict saved with torch.save")
    p.add_argument("out", help="output .safetensors")
    p.add_argument("--input", action="append", required=True, help="FILE.npy or FILE.safetensors[:NAME]")
    p.add_argument("--init", default="{}", help="JSON keyword arguments for the class")
    p.add_argument("--key", help="the state_dict is under this key of the saved dict")
    p.add_argument("--layers", help="comma-separated module names to record")
    p.add_argument("--leaves", action="store_true", help="record only modules without children")
    a = p.parse_args(argv)
    model = _load_class(a.model)(**json.loads(a.init))
    state = torch.load(a.weights, map_location="cpu", weights_only=True)
    if a.key:
        state = state[a.key]
    model.load_state_dict(state)
    inputs = tuple(_load_input(s) for s in a.input)
    layers = a.layers.split(",") if a.layers else None
    names = record(model, inputs, a.out, layers=layers, leaves=a.leaves)
    print(f"recorded {len(names)} tensors into {a.out}: {', '.join(names)}")


if __name__ == "__main__":
    main()
