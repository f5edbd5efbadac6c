"""The files of a run directory besides checkpoints and metrics: config.json, summary.json, diverged.json, the
data's meta and tokenizer (data_meta.json, tokenizer.json, ...); whether a run has finished or diverged; and
loading a run's model and tokenizer back."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from nlq.config import RunConfig
from nlq.data.shards import TokenData
from nlq.data.tokenizers import GPT2_FILES, load_tokenizer
from nlq.errors import UserError
from nlq.fileio import read_json, write_json
from nlq.model import Transformer
from nlq.plugins import import_modules
from nlq.projections import PROJECTIONS, check_own_code
from nlq.runs import checkpoint as ckpt

TOKENIZER_FILES = ("tokenizer.json", *GPT2_FILES)


DIVERGED = "diverged.json"  # in a run directory: the run stopped on a non-finite loss (or its chain did)


def run_diverged(run_dir: Path) -> bool:
    return (run_dir / DIVERGED).is_file()


def write_diverged(run_dir: Path, run_name: str, reason: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / DIVERGED, {"run": run_name, "reason": reason})


def run_ended(run_dir: Path, max_steps: int) -> bool:
    """Finished, or diverged: nothing more will be trained for it."""
    return run_finished(run_dir, max_steps) or run_diverged(run_dir)


def run_finished(run_dir: Path, max_steps: int) -> bool:
    """Trained to max_steps (or beyond: a WSD stable run's earlier segments are finished once a later one is)."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return False
    try:
        return (read_json(summary, "a run summary").get("final_step") or 0) >= max_steps
    except (UserError, TypeError):  # cut short by a kill while written: the run is redone from its checkpoint
        return False


def save_config(config: RunConfig, path: Path) -> None:
    write_json(path, config.to_dict())


def write_summary(run_dir: Path, summary: dict) -> None:
    write_json(Path(run_dir) / "summary.json", summary)


def copy_data_files(data: TokenData, run_dir: Path) -> None:
    """Keep what eval --text and sample need in the run directory: the data's meta and tokenizer files."""
    shutil.copyfile(data.directory / "meta.json", run_dir / "data_meta.json")
    for name in TOKENIZER_FILES:
        if (data.directory / name).is_file():
            shutil.copyfile(data.directory / name, run_dir / name)


def tokenizer_files(data: TokenData) -> dict:
    """The data's meta and tokenizer files as text, stored in every checkpoint."""
    files = {name: (data.directory / name).read_text() for name in TOKENIZER_FILES if (data.directory / name).is_file()}
    return {"data_meta": json.dumps(data.meta), "files": files}


def load_model(path: str | Path, device: str = "cpu") -> tuple[Transformer, RunConfig, dict]:
    """The model of a run directory (its latest checkpoint) or of a checkpoint file, in eval mode."""
    payload = ckpt.load_checkpoint(path)
    use_recorded_code(recorded_code(payload), str(payload["path"]))  # its code of one's own, from the file it records
    config = ckpt.payload_config(payload)
    ckpt.check_model_fits(config.model, payload["path"])
    model = Transformer(config.model)
    try:
        model.load_state_dict(payload["model"])
    except (RuntimeError, TypeError, AttributeError) as e:
        first_line = str(e).splitlines()[0][:200]
        raise UserError(f"checkpoint {payload['path']} does not match its config: {first_line}") from None
    return model.to(device).eval(), config, payload


def recorded_code(payload: dict) -> dict | None:
    """The projections of one's own a checkpoint was trained with: in the checkpoint, or (older ones) in its run's
    summary record."""
    if payload.get("projections") is not None:
        return payload["projections"]
    summary = run_dir_of(payload["path"]) / "summary.json"
    if summary.is_file():
        return (read_json(summary, "a run summary").get("record") or {}).get("projections")
    return None


def use_recorded_code(recorded: dict | None, where: str) -> None:
    """Import the projections of one's own that `where` was made with ({name: {class, file, sha256}}) from the files
    it recorded, where they are not registered yet (NLQ_IMPORT, read first, still overrides the location), after
    checking each file's sha256; then check every one (check_own_code). A missing or changed file is one line naming
    it, and nothing of a changed file is run."""
    for name, before in sorted((recorded or {}).items()):
        if name in PROJECTIONS or not isinstance(before, dict):
            continue
        file, digest = before.get("file"), before.get("sha256")
        if not file or not Path(file).is_file():
            raise UserError(f"{where} was made with projection {name} from {file} (sha256 {(digest or '?')[:16]}), "
                            f"which is missing: restore it there, or import it from where it is now with "
                            f"NLQ_IMPORT=PATH")
        now = hashlib.sha256(Path(file).read_bytes()).hexdigest()
        if digest and now != digest:
            raise UserError(f"{where} was made with projection {name} from {file} (sha256 {digest[:16]}), and that "
                            f"file now has sha256 {now[:16]}: restore the file it was made with (or NLQ_IMPORT=PATH "
                            f"of a copy of it)")
        import_modules([file], where=where)
        if name not in PROJECTIONS:
            raise UserError(f"{where}: {file} no longer registers projection {name}; restore the file it was made with")
    check_own_code(recorded, where)


def run_recorded_code(run_dir: str | Path) -> dict | None:
    """The projections of one's own a run directory was trained with: its summary's record, else its latest
    checkpoint's (a run that has not finished); None for a run of nlq's own projections or no run at all."""
    summary = Path(run_dir) / "summary.json"
    if summary.is_file():
        return (read_json(summary, "a run summary").get("record") or {}).get("projections")
    if not ckpt.list_checkpoints(run_dir):
        return None
    return recorded_code(ckpt.load_checkpoint(run_dir))


def run_dir_of(checkpoint_path: str | Path) -> Path:
    """The run directory a checkpoint file belongs to: RUN/checkpoints/step_N.pt or RUN/model.safetensors."""
    path = Path(checkpoint_path)
    return path.parent if path.suffix == ".safetensors" or path.parent.name != "checkpoints" else path.parent.parent


def tokenizer_folder(checkpoint_path: str | Path) -> tuple[Path, str] | None:
    """(a folder holding the tokenizer's files, the tokenizer's name) for a checkpoint: its run directory (training
    copies the files there), else the files the checkpoint carries (a checkpoint copied on its own), written to a
    temporary folder. None when neither knows the tokenizer."""
    path = Path(checkpoint_path)
    run_dir = run_dir_of(path)
    meta_path = run_dir / "data_meta.json"
    if meta_path.is_file():
        return run_dir, tokenizer_name(read_json(meta_path, "the run's copy of its data's meta.json"), meta_path)
    stored = ckpt.load_checkpoint(path).get("tokenizer") if path.suffix == ".pt" else None
    if not stored:
        return None
    try:
        meta, files = json.loads(stored["data_meta"]), dict(stored["files"])
    except (TypeError, KeyError, ValueError):
        raise UserError(f"{path} carries a malformed tokenizer record; use nlq eval --data instead") from None
    folder = Path(tempfile.mkdtemp(prefix="nlq-tokenizer-"))
    for name, text in files.items():
        if name in TOKENIZER_FILES:
            (folder / name).write_text(text)
    return folder, tokenizer_name(meta, path)


def tokenizer_name(meta, where: Path) -> str:
    name = meta.get("tokenizer") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise UserError(f"{where} names no tokenizer (no 'tokenizer' key); it was not written by nlq prepare or train")
    return name


def run_tokenizer(checkpoint_path: str | Path):
    """The tokenizer a run was trained with (tokenizer_folder), loaded."""
    found = tokenizer_folder(checkpoint_path)
    if found is None:
        raise UserError(f"{run_dir_of(checkpoint_path)} has no data_meta.json and {Path(checkpoint_path).name} carries "
                        f"no tokenizer, so the tokenizer is unknown; use nlq eval --data instead")
    return load_tokenizer(*found)
