"""A run's record without the absolute paths of the machine that trained it. A config names its data directory
(data.dir) and the checkpoints it starts from (train.resume_from, train.init_from) by absolute path, which says
nothing on another machine and tells where a file system was. Published records keep the data directory's name (its
content is recorded by hash: study.json's data_meta, each run's data_meta.json) and a checkpoint's path from the
study's runs/ on; nlq reads them as it read the absolute ones (a study compares paths by file name, data.dir not at
all)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

PATH_KEYS = ("dir", "resume_from", "init_from", "data_dir")  # config.json's data.dir, train.*; study.json's data_dir


def relative(value: str) -> str:
    """An absolute path as a record keeps it: from its last `runs/` segment on (a checkpoint of a study's run), else
    its last name (a data directory)."""
    parts = PurePosixPath(value).parts
    if "runs" in parts:
        return str(PurePosixPath(*parts[len(parts) - 1 - parts[::-1].index("runs"):]))
    return parts[-1] if parts else value


def scrubbed_text(text: str) -> str:
    """A config.json or study.json's text with every absolute path of PATH_KEYS made relative; every other byte kept."""
    pattern = re.compile(r'("(?:%s)": )"(/[^"]*)"' % "|".join(PATH_KEYS))
    return pattern.sub(lambda m: f'{m.group(1)}"{relative(m.group(2))}"', text)
