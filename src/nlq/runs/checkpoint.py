"""Checkpoints: atomic (temporary file, fsync, rename), never overwritten in place, the last K kept.

A checkpoint holds a full (unsharded) model and optimizer state keyed by parameter name, so a run saved
by N processes (DDP or FSDP) resumes in M. Loading uses torch.load(weights_only=True): no pickled code.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from nlq.config import ModelConfig, RunConfig
from nlq.errors import UserError
from nlq.fileio import atomic_write

_NAME = re.compile(r"^step_(\d{7,})\.pt$")
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DDP


def step_of(path: str | Path) -> int:
    """The step in a checkpoint's file name (step_0001200.pt -> 1200); for a run directory, its latest's; 0 if none."""
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
        if path is None:
            return 0
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else 0


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    folder = checkpoint_dir(run_dir)
    found = [p for p in folder.glob("step_*.pt") if _NAME.match(p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def full_state(model, optimizer) -> tuple[dict, dict]:
    """Unsharded model and optimizer state, on CPU, keyed by parameter name (collective under FSDP)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(model, optimizer, options=options)


def load_full_state(model, optimizer, model_state: dict, optim_state: dict | None) -> None:
    options = StateDictOptions(full_state_dict=True)
    if optimizer is None:
        set_state_dict(model, (), model_state_dict=model_state, optim_state_dict={}, options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=options)


def payload_digest(payload: dict) -> str:
    """A blake2b digest of everything in a payload except its "checksum" and "path": every tensor's dtype,
    shape and bytes, every other value's repr, in key order. Stored at save, recomputed at load, so a
    flipped byte anywhere in the tensor data is caught instead of silently training on it."""
    digest = hashlib.blake2b(digest_size=16)

    def visit(value) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous().reshape(-1)  # 0-d tensors (optimizer steps) too
            digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                if key not in ("checksum", "path"):
                    digest.update(f"K{key!r}".encode())
                    visit(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"L{len(value)}".encode())
            for item in value:
                visit(item)
        else:
            digest.update(f"V{value!r}".encode())

    visit(payload)
    return digest.hexdigest()


def save_checkpoint(run_dir: Path, step: int, payload: dict, keep: int) -> Path:
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:07d}.pt"
    payload = payload | {"checksum": payload_digest(payload)}
    try:  # atomic: readers see the old file set or the new one, never half a file
        atomic_write(path, lambda f: torch.save(payload, f), durable=True)
    except (OSError, RuntimeError) as e:  # a full disk shows as RuntimeError from torch's zip writer
        raise UserError(f"cannot write checkpoint {path}: {_reason(e)}; the earlier checkpoints are untouched; "
                        f"free space (or fix permissions) and resume") from None
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink()
    return path


MODEL_FILE = "model.safetensors"


def save_model_only(run_dir: Path, model_state: dict, config: dict, step: int) -> Path:
    """The final weights alone, in safetensors (no optimizer, no pickle), with the run's config in the file's
    metadata: what a user shares or loads elsewhere (nlq eval/sample/export take it too). Resume state stays
    in checkpoints/."""
    from safetensors.torch import save as safetensors_bytes

    path = Path(run_dir) / MODEL_FILE
    tensors, seen = {}, {}
    for name, tensor in model_state.items():  # a tied lm_head is the token embedding: stored once
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen[key] = name
        tensors[name] = tensor.detach().contiguous()
    metadata = {"format": "pt", "nlq_config": json.dumps(config), "step": str(step),
                "nlq_checksum": payload_digest(tensors)}  # verified by load_model_only
    return atomic_write(path, safetensors_bytes(tensors, metadata=metadata), durable=True)


def load_model_only(path: Path) -> dict:
    """A model.safetensors as a checkpoint payload (weights, config, step; no optimizer)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        state = load_file(str(path))
        config = json.loads(metadata["nlq_config"])
        step = int(metadata.get("step", 0))
    except Exception as e:
        raise UserError(f"{path} is not an nlq model file ({type(e).__name__}); "
                        "use a run directory or a checkpoint") from None
    if not isinstance(config, dict) or not isinstance(config.get("model", {}), dict):
        raise UserError(f"{path} is not an nlq model file (its nlq_config metadata is no config); use a run "
                        f"directory or a checkpoint")
    if "nlq_checksum" in metadata and payload_digest(state) != metadata["nlq_checksum"]:  # nlq <= 0.2 wrote none
        raise UserError(f"{path} is corrupt: its weights do not match the checksum stored in it; use a checkpoint "
                        f"in {path.parent / 'checkpoints'}")
    tied = config.get("model", {}).get("tie_embeddings", True)
    if tied and "lm_head.weight" not in state and "tok_emb.weight" in state:
        state["lm_head.weight"] = state["tok_emb.weight"]
    return {"model": state, "step": step, "config": config, "path": str(path)}


def payload_config(payload: dict) -> RunConfig:
    """The validated RunConfig a checkpoint payload carries; a one-line error when it holds none."""
    raw = payload.get("config")
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise UserError(f"{payload.get('path')} carries no valid config (a mapping of sections); "
                        "it was not written by nlq")
    try:
        return RunConfig.from_dict(raw)
    except UserError as e:
        raise UserError(f"{payload.get('path')} carries an invalid config: {e}") from None


def check_model_fits(model: ModelConfig, where: str) -> None:
    """Refuse, before building anything, a model whose weights alone would not fit in this machine's memory."""
    need = 4.0 * model.approx_parameters()
    have = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    if need > have:
        raise UserError(f"{where} describes a model of about {model.approx_parameters():,} parameters "
                        f"({need / 2**30:,.1f} GiB in fp32) and this machine has {have / 2**30:,.1f} GiB; not loaded")


def looks_like_torch_file(path: Path) -> bool:
    """Whether a file starts like torch.save output: a zip archive (or, from old torch, a pickle)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def resolve_checkpoint(path_or_run: str | Path) -> Path:
    """A checkpoint file, or the latest checkpoint of a run directory."""
    path = Path(path_or_run)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None and path.name == "checkpoints":  # the run's checkpoint folder itself
            found = latest_checkpoint(path.parent)
        if found is None:
            raise UserError(f"{path} holds no checkpoint (looked in {checkpoint_dir(path)})")
        return found
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; give a run directory or a .pt checkpoint file")
    return path


def load_checkpoint(path: str | Path) -> dict:
    path = resolve_checkpoint(path)
    if path.suffix == ".safetensors":
        return load_model_only(path)
    if not looks_like_torch_file(path):
        raise UserError(f"checkpoint {path} is corrupt or not an nlq checkpoint (not a torch.save archive); give a "
                        f"run directory, one of its checkpoints/step_*.pt or its model.safetensors")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" not in str(e).lower():  # a damaged pickle stream
            raise UserError(f"checkpoint {path} is corrupt ({str(e).splitlines()[0][:80]}); use an earlier one in "
                            f"{path.parent}") from None
        # weights_only refused something that is no tensor: pickled code, or other objects
        raise UserError(f"{path} holds Python objects other than tensors and plain values (pickled code, perhaps "
                        f"malicious), so it was not loaded (weights_only=True; {str(e).splitlines()[0][:80]}); "
                        f"it is no nlq checkpoint") from None
    except Exception as e:  # truncated, corrupt, or not a torch file
        raise UserError(f"checkpoint {path} is corrupt or not an nlq checkpoint ({type(e).__name__}); "
                        f"use an earlier one in {path.parent}") from None
    if not isinstance(payload, dict) or not {"model", "step", "config"} <= payload.keys():
        raise UserError(f"{path} is not an nlq checkpoint (missing model/step/config)")
    others = [p.name for p in list_checkpoints(path.parent.parent) if p != path] if _NAME.match(path.name) else []
    earlier = f"; other checkpoints in {path.parent}: {', '.join(others)}" if others else ""
    if "checksum" in payload and payload_digest(payload) != payload["checksum"]:  # nlq 0.1 wrote none
        raise UserError(f"checkpoint {path} is corrupt: its contents do not match the checksum stored in it{earlier}")
    if _NAME.match(path.name) and int(_NAME.match(path.name).group(1)) != payload["step"]:
        raise UserError(f"checkpoint {path} holds step {payload['step']}, not the step in its name{earlier}")
    payload["model"] = clean_state_dict(payload["model"])
    payload["path"] = str(path)
    return payload


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return "no space left on the device or the file could not be written" if "PytorchStreamWriter" in text else text


def clean_state_dict(state: dict) -> dict:
    """Strip the prefixes torch.compile and DDP add, so their checkpoints load into a bare model."""
    cleaned = {}
    for key, value in state.items():
        changed = True
        while changed:
            changed = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix):], True
        cleaned[key] = value
    return cleaned


# ---- random state: each rank's own, so dropout continues exactly on resume -------------------------------

def rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(payload: dict, rank: int, world: int, seed: int, device: torch.device) -> None:
    """Each rank gets back its own RNG state (dropout masks differ per rank and continue exactly). When the
    world size changed, no saved state belongs to a rank: each rank is then seeded from (seed, step, rank),
    so ranks still differ, deterministically, though the stream differs from the uninterrupted run's."""
    states = payload.get("rng_ranks") or [payload.get("rng") or {}]  # nlq 0.1 saved rank 0's only
    if len(states) != world:
        torch.manual_seed(int.from_bytes(hashlib.blake2b(f"{seed}/{payload['step']}/{rank}".encode(),
                                                         digest_size=8).digest(), "little") >> 1)
        return
    rng = states[rank]
    if "cpu" in rng:
        torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)
