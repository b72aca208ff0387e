"""Numbers and progress for people and for JSON: the one place that rounds and formats them and
that shows how far a long step has got.

- :func:`round_or_none` / :func:`round_values`: a float rounded to a number of decimals for JSON
  summaries, payloads and ``--json`` output; ``None`` where the value is NaN or infinite, since
  JSON has neither (``json.dumps`` would write the non-standard ``NaN`` / ``Infinity``).
- :func:`round_sig_or_none`: the same to a number of *significant* digits, for values that span
  many scales (head-importance scores).
- :func:`fmt_float` / :func:`fmt_int`: a cell of a markdown or HTML table; a missing value (``None``
  or NaN) is one dash, so a column of numbers stays readable.

- :func:`array_summary`: an array or tensor as ``tensor[2×4 float32]`` in the one-line reprs of
  the result objects (never the values).
- :func:`progress_bar`: the one progress display of every step a user waits for (stage 1 and 2
  of a fit, evaluation, each lens, a bench): a tqdm bar where it can redraw (a terminal, a
  notebook), else :class:`PlainProgress`, plain lines at each tenth of the work (a log file, a
  pipe: no carriage-return redraws).
- :class:`StageLog`: plain lines naming the stages of a long run (the frontier's seeds, selectors,
  budgets and resamples) and, where output is not live, a heartbeat line at least every
  ``every_s`` seconds of a stage that writes nothing else (checked at each block of the model).

A leaf module: the standard library only (tqdm is imported when a live bar is drawn), importable
from anywhere in sitelens.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping

MISSING = "–"  # an en dash: a missing value in a table
monotonic = time.monotonic  # the one clock of progress lines (a test replaces it with a fake one)
_last_line = [monotonic()]  # when a plain progress line was last written (StageLog's heartbeat reads it)


def now() -> float:
    """The progress clock's time in seconds (:data:`monotonic`, looked up at each call)."""
    return monotonic()


def round_or_none(x, digits: int = 4):
    """``x`` as a float rounded to ``digits`` decimals; ``None`` if it is NaN, infinite or
    ``None``; returned unchanged if it is not a number."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return x
    return None if not math.isfinite(x) else round(x, digits)


def round_values(numbers: Mapping, digits: int = 4) -> dict:
    """:func:`round_or_none` of every value of ``numbers``, keys and order kept."""
    return {k: round_or_none(v, digits) for k, v in numbers.items()}


def round_sig_or_none(x, digits: int = 4) -> float | None:
    """``x`` as a float to ``digits`` significant digits (``-0.0`` written as ``0.0``); ``None``
    if it is NaN or infinite."""
    x = float(x)
    return None if not math.isfinite(x) else float(f"{x:.{digits}g}") + 0.0


def fmt_float(x, digits: int = 3, missing: str = MISSING) -> str:
    """``x`` with ``digits`` decimals, or ``missing`` for ``None`` and NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return f"{x:.{digits}f}"


def fmt_int(x, missing: str = MISSING) -> str:
    """``x`` rounded to an integer with thousands separators (``12,345``), or ``missing`` for
    ``None`` and NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return f"{int(round(x)):,}"


def array_summary(x) -> str:
    """``tensor[2×4×8 float32]`` for a tensor or array (its kind, shape and dtype, not its values);
    ``[n × tensor[...]]`` for a list of them (per-layer rows); ``repr`` for anything else."""
    if isinstance(x, (list, tuple)) and x and all(hasattr(v, "shape") for v in x):
        return f"[{len(x)} × {array_summary(x[0])}]"
    shape = getattr(x, "shape", None)
    if shape is None:
        return repr(x)
    kind = "tensor" if type(x).__module__.startswith("torch") else type(x).__name__
    dtype = str(getattr(x, "dtype", "")).removeprefix("torch.")
    return f"{kind}[{'×'.join(str(int(n)) for n in shape) or 'scalar'} {dtype}]"


# ----------------------------------------------------------------------------------------------
# progress


class PlainProgress:
    """Progress as plain lines, for output that is not a terminal (a log file, a pipe): one line
    ``"{desc}: {n}/{total} ({pct}%) {seconds}s"`` each time another tenth of ``total`` is done (the
    last ``... done in {seconds}s``), and one at least every ``every_s`` seconds between them, so a
    bar writes at most ten lines plus one per ``every_s`` of waiting; never a ``\\r`` redraw.
    Without a known total, a line every ``every_s`` seconds and one when closed.

    The part of tqdm's interface that sitelens uses: iteration, ``update``, ``set_postfix``,
    ``set_description``, ``close`` and ``with``. ``quiet=True``: the same object writing nothing
    (a bar switched off)."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None,
                 desc: str = "", stream=None, every_s: float = 60.0, quiet: bool = False,
                 clock: Callable[[], float] = now):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.total, self.desc, self.n = iterable, total, desc, 0
        self.stream, self.every_s, self.quiet, self.clock = stream, every_s, quiet, clock
        self.postfix = ""
        self.t0 = self.last = clock()
        self.tenths = 0  # tenths of the total already written
        self.closed = False

    def __iter__(self):
        try:
            for x in self.iterable:
                yield x
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if self.total:
            tenths = min(10, 10 * self.n // self.total)
            if tenths > self.tenths:
                self.tenths = tenths
                self._line(now)
                return
        if now - self.last >= self.every_s:
            self._line(now)

    def set_postfix(self, ordered_dict: Mapping | None = None, refresh: bool = True, **kwargs) -> None:
        items = {**dict(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if not self.total:
                self._line(self.clock(), done=True)

    def _line(self, now: float, done: bool = False) -> None:
        self.last = now
        if self.quiet:
            return
        secs = f"{now - self.t0:.1f}s"
        if self.total:
            done = self.n >= self.total
            count = f"{self.n}/{self.total}"
            text = f"{count} done in {secs}" if done else f"{count} ({100 * self.n // self.total}%) {secs}"
        else:
            text = f"{self.n} done in {secs}" if done else f"{self.n} {secs}"
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"{self.desc}: {text}" + (f"  {self.postfix}" if self.postfix else "") + "\n")
        stream.flush()
        _last_line[0] = now


def live_output(stream) -> bool:
    """Whether a progress bar can redraw itself on ``stream``: a terminal, or a Jupyter kernel
    (where tqdm draws a widget)."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False
    ipython = sys.modules.get("IPython")
    try:
        return ipython is not None and "IPKernelApp" in ipython.get_ipython().config
    except Exception:  # no running IPython, or one without a config
        return False


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 enabled: bool = True, leave: bool = False, stream=None):
    """A progress display over ``iterable`` (or ``total`` steps advanced with ``update``) named
    ``desc``, on ``stream`` (default: ``sys.stderr`` at the time of the call). ``enabled=False``:
    nothing is written. A terminal or a notebook gets a tqdm bar (``tqdm.auto``; ``leave``: it
    stays once done); any other stream, e.g. stderr redirected to a log file, gets
    :class:`PlainProgress` lines."""
    stream = sys.stderr if stream is None else stream
    if enabled and live_output(stream):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, leave=leave, file=stream)
    return PlainProgress(iterable, total=total, desc=desc, stream=stream, quiet=not enabled)


class StageLog:
    """Plain lines ``"{desc}: {text}"`` naming each stage of a long run as it starts and ends
    (:meth:`write`, :meth:`begin`), never a ``\\r`` redraw, on ``stream`` (default: ``sys.stderr``
    at each write). A stage that writes nothing for ``every_s`` seconds gets a heartbeat line
    ``"{desc}: {stage}: still running, {seconds}s"``: :meth:`watch` checks at every block of the
    model (a forward pre-hook on each of ``model.blocks``), so no stage of model work stays
    silent much longer than ``every_s``. The heartbeat is off where output is live (a terminal or
    a notebook: tqdm bars show their own time). ``enabled=False``: nothing is written."""

    def __init__(self, desc: str, *, enabled: bool = True, stream=None, every_s: float = 30.0):
        self.desc, self.enabled, self._stream, self.every_s = desc, enabled, stream, every_s
        self.stage, self.stage_t0, self.t0 = "", now(), now()
        self.heartbeat = enabled and not live_output(self.stream)
        _last_line[0] = now()

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def write(self, text: str) -> None:
        """One line ``"{desc}: {text}"``."""
        if not self.enabled:
            return
        self.stream.write(f"{self.desc}: {text}\n")
        self.stream.flush()
        _last_line[0] = now()

    def begin(self, stage: str, text: str | None = None) -> None:
        """Start ``stage`` (what the heartbeat names) and write ``text`` (default ``stage``)."""
        self.stage, self.stage_t0 = stage, now()
        self.write(stage if text is None else text)

    def seconds(self) -> float:
        """Seconds since the log was made."""
        return now() - self.t0

    def beat(self) -> None:
        """The heartbeat line, if nothing was written for ``every_s`` seconds."""
        t = now()
        if self.heartbeat and t - _last_line[0] >= self.every_s:
            self.write(f"{self.stage or 'running'}: still running, {t - self.stage_t0:.0f}s")

    def watch(self, model) -> _Watch:
        """A ``with`` block in which every block of ``model`` (``model.blocks``, else the model
        itself) calls :meth:`beat` as it starts."""
        return _Watch(self, model)


class _Watch:
    def __init__(self, log: StageLog, model):
        self.log, self.model, self.handles = log, model, []

    def __enter__(self) -> StageLog:
        if self.log.heartbeat and self.model is not None:
            mods = list(getattr(self.model, "blocks", None) or [self.model])
            self.handles = [m.register_forward_pre_hook(lambda *_: self.log.beat()) for m in mods]
        return self.log

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


__all__ = ["MISSING", "PlainProgress", "StageLog", "array_summary", "fmt_float", "fmt_int", "live_output",
           "now", "progress_bar", "round_or_none", "round_sig_or_none", "round_values"]
