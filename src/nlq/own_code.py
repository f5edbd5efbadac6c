"""Code of the user's own inside nlq's work (projections registered from a plugin file): an error it raises, or a
sys.exit it calls, while nlq builds or runs a model becomes one line naming the projection and its file, before a
run directory is written; an error of nlq's own passes through unchanged."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from nlq.errors import UserError
from nlq.projections import own_sources


@contextlib.contextmanager
def guarded(names: Iterable[str], doing: str) -> Iterator[None]:
    """Around nlq's work with the projections `names` (a model's placements): what their own code raises or exits
    with is a UserError naming it; anything else is re-raised as it is."""
    own = {name: Path(source["file"]).resolve() for name, source in own_sources(names).items() if source["file"]}
    try:
        yield
    except UserError:
        raise
    except (Exception, SystemExit) as error:
        files = {Path(frame.filename).resolve() for frame in traceback.extract_tb(error.__traceback__)}
        culprits = [name for name, file in own.items() if file in files]
        if not culprits:
            raise
        name = culprits[0]
        what = (f"called sys.exit({error.code!r})" if isinstance(error, SystemExit)
                else f"raised {type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}")
        raise UserError(f"projection {name} ({own[name]}) {what} while {doing}; fix the projection (a projection "
                        f"reports a mistake by raising an error, never by exiting)") from None


def first_batch(model, x, y, config, autocast) -> None:
    """The model with projections of one's own reads its first batch once (eval mode, no gradient, no random draw,
    so training is unchanged): code that fails on real data fails here, in one line, before a run directory exists."""
    model.eval()
    try:
        with guarded(config.model.placements.values(), "the model read its first batch"), torch.no_grad(), autocast:
            model(x, y, loss_impl=config.train.loss_impl, loss_chunk=config.train.loss_chunk)
    finally:
        model.train()
