"""The training batches: non-overlapping windows of ``seq_len + 1`` tokens in a fresh seeded order every epoch,
from one token array or several versions of the training split (names randomised afresh, see
:mod:`sprout_model.augment`), with a share of rows replaced by the un-renamed text (``real_rows``) or by tokens
repeating with a random period (``copy_rows``). :class:`Batches` draws them in host memory (numpy);
:class:`TorchBatches` draws the same windows on a GPU from token arrays moved there once."""
from __future__ import annotations

import numpy as np
import torch

from .augment import repeated_random_row, repeated_text_row

COPY_SOURCES = ("random", "text", "mixed")  # what a copy row repeats: random tokens, its own text, or either evenly


class Batches:
    """Non-overlapping windows of seq_len+1 tokens, in a fresh seeded order every epoch.

    ``views`` is one token array, or several versions of the training split (e.g. with names
    randomised afresh, see ``sprout_model.augment``): epoch e reads view e mod len(views).
    A ``real_rows`` share of rows is instead a window of ``real`` (the un-renamed training text, so
    a model trained on name views still sees the real names its validation text has), and a
    ``copy_rows`` share of rows is replaced by random tokens repeating with a random period.
    The position (epoch, cursor) is all the state there is, so a resumed run sees exactly the
    batches an uninterrupted one would.
    """

    def __init__(self, views: np.ndarray | list[np.ndarray], seq_len: int, batch_size: int, seed: int,
                 copy_rows: float = 0.0, vocab_size: int = 8192, copy_source: str = "random",
                 real: np.ndarray | None = None, real_rows: float = 0.0):
        self.views = views if isinstance(views, list) else [views]
        if real_rows and real is None:
            raise ValueError("real_rows needs the real training text")
        self.real, self.real_rows = real, real_rows
        self.T, self.B, self.seed = seq_len, batch_size, seed
        self.copy_rows, self.vocab_size = copy_rows, vocab_size
        if copy_source not in COPY_SOURCES:
            raise ValueError(f"copy_source must be one of {', '.join(map(repr, COPY_SOURCES))}, got {copy_source!r}")
        self.copy_source = copy_source
        n = min((len(v) - 1) // seq_len for v in self.views)
        if n < batch_size:
            raise ValueError(f"only {n} windows of {seq_len} tokens; need at least batch_size={batch_size}")
        self.epoch, self.cursor = 0, 0
        self._set_epoch(0)

    def _set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.tokens = self.views[epoch % len(self.views)]
        self.n = (len(self.tokens) - 1) // self.T
        self._order = np.random.default_rng(self.seed + epoch).permutation(self.n)

    def state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state(self, s: dict) -> None:
        self._set_epoch(s["epoch"])
        self.cursor = s["cursor"]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.B > self.n:
            self._set_epoch(self.epoch + 1)
            self.cursor = 0
        rng = np.random.default_rng([self.seed, self.epoch, self.cursor])  # a function of the position alone
        starts = self._order[self.cursor: self.cursor + self.B] * self.T
        self.cursor += self.B
        rows = np.stack([self.tokens[s: s + self.T + 1] for s in starts]).astype(np.int64)
        if self.real_rows > 0:  # its own generator: runs without real rows keep their exact batches
            r = np.random.default_rng([self.seed, self.epoch, self.cursor, 1])
            n_real = (len(self.real) - 1) // self.T
            for i in np.flatnonzero(r.random(self.B) < self.real_rows):
                s = int(r.integers(n_real)) * self.T
                rows[i] = self.real[s: s + self.T + 1]
        if self.copy_rows > 0:
            picked = np.flatnonzero(rng.random(self.B) < self.copy_rows)
            # "mixed": each copy row's source drawn by its own generator, so "random" and "text" keep their batches
            mixed = np.random.default_rng([self.seed, self.epoch, self.cursor, 2]).random(len(picked)) < 0.5
            for i, text in zip(picked, mixed):
                if self.copy_source == "text" or (self.copy_source == "mixed" and text):
                    rows[i] = repeated_text_row(rng, rows[i])
                else:
                    rows[i] = repeated_random_row(rng, self.T + 1, self.vocab_size)
        x = torch.from_numpy(rows)
        return x[:, :-1], x[:, 1:]


MIN_COPY_PERIOD = 8  # the shortest period of a copy row (augment.repeated_random_row's default)


class TorchBatches:
    """The batches of :class:`Batches`, drawn on ``device`` (a GPU) from token arrays moved there once.

    The windows are Batches' exactly (the same seeded order of non-overlapping windows every epoch, view
    e mod len(views) in epoch e), so without copy or real rows both give the same batches. The real rows
    (a ``real_rows`` share: a random window of ``real``) and copy rows (a ``copy_rows`` share: random tokens
    1..vocab_size-1, or with ``copy_source`` "text" the row's own start, repeating with a period drawn from
    8..(seq_len+1)//2) are drawn by torch generators on ``device`` seeded by the position (seed, epoch,
    cursor), so the position is all the state there is and a resumed run sees the batches an uninterrupted
    one would on the same kind of device; they are not Batches' numpy draws. The tokens are held as int32
    (11.9M tokens: 48 MB) and a batch costs one gather and, with copy rows, one more.
    """

    def __init__(self, views: np.ndarray | list[np.ndarray], seq_len: int, batch_size: int, seed: int,
                 copy_rows: float = 0.0, vocab_size: int = 8192, copy_source: str = "random",
                 real: np.ndarray | None = None, real_rows: float = 0.0, device: str | torch.device = "cpu"):
        views = views if isinstance(views, list) else [views]
        if real_rows and real is None:
            raise ValueError("real_rows needs the real training text")
        if copy_source not in COPY_SOURCES:
            raise ValueError(f"copy_source must be one of {', '.join(map(repr, COPY_SOURCES))}, got {copy_source!r}")
        if copy_rows > 0 and (seq_len + 1) // 2 < MIN_COPY_PERIOD:
            raise ValueError(f"copy rows repeat with a period of at least {MIN_COPY_PERIOD} tokens, so they need "
                             f"seq_len {2 * MIN_COPY_PERIOD - 1} or more, got {seq_len}")
        n = min((len(v) - 1) // seq_len for v in views)
        if n < batch_size:
            raise ValueError(f"only {n} windows of {seq_len} tokens; need at least batch_size={batch_size}")
        self.device = torch.device(device)
        self.T, self.B, self.seed = seq_len, batch_size, seed
        self.copy_rows, self.vocab_size, self.copy_source = copy_rows, vocab_size, copy_source
        self.real_rows = real_rows
        self.views = [self._put(v) for v in views]
        self.real = self._put(real) if real_rows else None
        self._pos = torch.arange(seq_len + 1, device=self.device)
        self._gen = torch.Generator(device=self.device)
        self.epoch, self.cursor = 0, 0
        self._set_epoch(0)

    def _put(self, tokens: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(tokens).astype(np.int32)).to(self.device)

    def _set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.tokens = self.views[epoch % len(self.views)]
        self.n = (len(self.tokens) - 1) // self.T
        order = np.random.default_rng(self.seed + epoch).permutation(self.n)  # Batches' order
        self._order = torch.from_numpy(order).to(self.device)

    def state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "sampler": "torch"}

    def load_state(self, s: dict) -> None:
        self._set_epoch(s["epoch"])
        self.cursor = s["cursor"]

    def _seeded(self, stream: int) -> torch.Generator:
        """The generator for this position's draws of one kind (0: copy rows, 1: real rows)."""
        seed = np.random.SeedSequence([self.seed, self.epoch, self.cursor, stream]).generate_state(1, np.uint64)[0]
        return self._gen.manual_seed(int(seed) & (2**63 - 1))

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.B > self.n:
            self._set_epoch(self.epoch + 1)
            self.cursor = 0
        starts = self._order[self.cursor: self.cursor + self.B] * self.T
        self.cursor += self.B
        rows = self.tokens[starts[:, None] + self._pos]  # (B, T+1)
        if self.real_rows > 0:
            g = self._seeded(1)
            take = torch.rand(self.B, generator=g, device=self.device) < self.real_rows
            at = torch.randint((len(self.real) - 1) // self.T, (self.B,), generator=g, device=self.device) * self.T
            rows = torch.where(take[:, None], self.real[at[:, None] + self._pos], rows)
        if self.copy_rows > 0:
            g = self._seeded(0)
            take = torch.rand(self.B, generator=g, device=self.device) < self.copy_rows
            period = torch.randint(MIN_COPY_PERIOD, (self.T + 1) // 2 + 1, (self.B,), generator=g, device=self.device)
            if self.copy_source == "text":
                source = rows
            else:
                source = torch.randint(1, self.vocab_size, rows.shape, generator=g, device=self.device, dtype=rows.dtype)
                if self.copy_source == "mixed":  # each copy row's source drawn by its own generator
                    text = torch.rand(self.B, generator=self._seeded(2), device=self.device) < 0.5
                    source = torch.where(text[:, None], rows, source)
            rows = torch.where(take[:, None], source.gather(1, self._pos % period[:, None]), rows)
        x = rows.long()
        return x[:, :-1], x[:, 1:]
