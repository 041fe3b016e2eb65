"""Everything the rollout viewer does that is not UI: find dumps, load them leniently, filter,
sort, and render one sample turn by turn as rich Text.

Kept apart from the textual App so it is easy to test and to reuse from a notebook. Records are
validated against `DumpRecord` on load; a tool rollout's turns, calls and errors are read back
through `TrajectoryRecord`, the type the tool loop wrote them with.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text

from slime.observability.rollout_dump import DumpRecord, sample_to_record
from slime.utils.trajectory import TrajectoryRecord


@dataclass
class Source:
    """One dump file: a training step, an eval dataset at a step, or a `.pt` debug file."""

    path: Path
    kind: str  # "train" | "eval" | "debug"
    step: int | str
    dataset: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "eval":
            return f"eval {self.dataset} @ {self.step}"
        return f"{'debug' if self.kind == 'debug' else 'step'} {self.step}"


@dataclass
class Loaded:
    records: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0
    error: str | None = None


def _step_of(path: Path) -> int | str:
    """`7.jsonl` -> 7, `rollout_7.pt` -> 7 (the --save-debug-rollout-data pattern), else the stem."""
    m = re.fullmatch(r"(?:.*\D)?(\d+)", path.stem)
    return int(m.group(1)) if m else path.stem


def _sort_key(src: Source) -> tuple:
    step = src.step
    return (
        {"train": 0, "eval": 1, "debug": 2}[src.kind],
        src.dataset or "",
        (0, step, "") if isinstance(step, int) else (1, 0, str(step)),
    )


def discover(roots: str | Path | list[str | Path]) -> list[Source]:
    """Dump files under each root: `*.jsonl` (train), `eval/<ds>/*.jsonl` (eval), `**/*.pt` (debug)."""
    if isinstance(roots, (list, tuple)):
        return sorted({s.path: s for r in roots for s in discover(r)}.values(), key=_sort_key)
    root = Path(roots)
    if root.is_file():
        kind = "debug" if root.suffix == ".pt" else "train"
        return [Source(root, kind, _step_of(root))]
    if not root.is_dir():
        return []
    out: list[Source] = []
    for p in root.rglob("*"):
        if not p.is_file() or p.name.startswith(".") or p.name == "metrics.jsonl":
            continue
        rel = p.relative_to(root).parts
        if p.suffix == ".pt":
            out.append(Source(p, "debug", _step_of(p)))
        elif p.suffix == ".jsonl":
            if len(rel) >= 3 and rel[0] == "eval":
                out.append(Source(p, "eval", _step_of(p), dataset="/".join(rel[1:-1])))
            elif len(rel) == 1:
                out.append(Source(p, "train", _step_of(p)))
    return sorted(out, key=_sort_key)


def load(src: Source) -> Loaded:
    """Records of one file; torn or invalid lines are counted, never fatal."""
    if src.path.suffix == ".pt":
        return _load_pt(src)
    res = Loaded()
    try:
        text = src.path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return Loaded(error=str(e))
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = DumpRecord.model_validate_json(line).model_dump(mode="json")
        except ValueError:
            res.bad_lines += 1
            continue
        rec["images"] = [str(src.path.parent / name) for name in rec.get("images") or []]  # found from anywhere
        res.records.append(rec)
    return res


def _load_pt(src: Source) -> Loaded:
    try:
        import torch

        from slime.utils.types import Sample

        data = torch.load(src.path, weights_only=True, map_location="cpu")
        step = data.get("rollout_id", src.step) if isinstance(data, dict) else src.step
        res = Loaded()
        fields = set(Sample.__dataclass_fields__)
        for d in (data.get("samples") or []) if isinstance(data, dict) else []:
            try:
                s = Sample.from_dict({k: v for k, v in d.items() if k in fields})
                res.records.append(sample_to_record(None, step if isinstance(step, int) else 0, s))
            except Exception:  # noqa: BLE001 - one bad sample must not hide the others
                res.bad_lines += 1
        return res
    except Exception as e:  # noqa: BLE001 - truncated / foreign .pt file
        return Loaded(error=f"{type(e).__name__}: {e}")


# ------------------------------------------------------------------ query, filter, sort

_CMP = re.compile(r"^(score|len|turns|errors)(>=|<=|!=|>|<|=)(-?[\d.]+(?:e-?\d+)?)$")
SORTS = ("index", "score ↓", "score ↑", "length ↓", "status")


@dataclass
class Query:
    text: list[str] = field(default_factory=list)
    status: set[str] = field(default_factory=set)
    dataset: set[str] = field(default_factory=set)
    tool: set[str] = field(default_factory=set)
    numeric: list[tuple[str, str, float]] = field(default_factory=list)


def trajectory(rec: dict) -> TrajectoryRecord | None:
    """The tool loop's record of a dump line (None for single-turn samples)."""
    data = rec.get("trajectory")
    return None if data is None else TrajectoryRecord.model_validate(data)


def turns(rec: dict) -> int:
    traj = trajectory(rec)
    return (traj.turns if traj else 0) or 1


def tool_calls(rec: dict) -> dict[str, int]:
    traj = trajectory(rec)
    return traj.tool_calls if traj else {}


def error_count(rec: dict) -> int:
    """Tool errors plus parse errors: the number of error records."""
    traj = trajectory(rec)
    return len(traj.tool_errors) + len(traj.parse_errors) if traj else 0


def parse_query(q: str) -> Query:
    """`free text "quoted phrase" status:truncated dataset:gsm8k tool:python score>0 len<100 turns>=2 errors>0`."""
    try:
        words = shlex.split(q)
    except ValueError:
        words = q.split()
    out = Query()
    for w in words:
        m = _CMP.match(w)
        if m:
            out.numeric.append((m.group(1), m.group(2), float(m.group(3))))
        elif ":" in w and w.split(":", 1)[0] in ("status", "dataset", "tool") and w.split(":", 1)[1]:
            key, val = w.split(":", 1)
            getattr(out, key).update(v.lower() for v in val.split(","))
        else:
            out.text.append(w.lower())
    return out


def _num(rec: dict, key: str) -> float | None:
    if key == "turns":
        return float(turns(rec))
    if key == "errors":
        return float(error_count(rec))
    v = rec.get("score") if key == "score" else rec.get("response_length")
    return None if v is None else float(v)


def _ok(a: float, op: str, b: float) -> bool:
    return {">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b, "=": a == b, "!=": a != b}[op]


def haystack(rec: dict) -> str:
    parts = [rec.get("input", ""), rec.get("output", ""), str(rec.get("label", ""))]
    traj = trajectory(rec)
    for m in traj.tool_messages if traj else []:
        parts += [m.name or "", json.dumps(m.arguments, ensure_ascii=False), m.response or "", m.error or ""]
    return "\n".join(parts).lower()


def matches(rec: dict, q: Query) -> bool:
    if q.status and str(rec.get("status", "")).lower() not in q.status:
        return False
    if q.dataset and str(rec.get("dataset") or "").lower() not in q.dataset:
        return False
    if q.tool and not q.tool & {k.lower() for k in tool_calls(rec)}:
        return False
    for key, op, val in q.numeric:
        v = _num(rec, key)
        if v is None or not _ok(v, op, val):
            return False
    if q.text:
        hay = haystack(rec)
        return all(t in hay for t in q.text)
    return True


def sort_records(recs: list[dict], mode: str) -> list[dict]:
    def score(r: dict) -> float:
        return r["score"] if r.get("score") is not None else float("-inf")

    if mode == "score ↓":
        return sorted(recs, key=score, reverse=True)
    if mode == "score ↑":
        return sorted(recs, key=score)
    if mode == "length ↓":
        return sorted(recs, key=lambda r: r.get("response_length", 0), reverse=True)
    if mode == "status":
        return sorted(recs, key=lambda r: str(r.get("status")))
    return recs


# ------------------------------------------------------------------ rendering


class Decoder:
    """Token ids -> text with a `tokenizer.json` (fast `tokenizers` load, no transformers import)."""

    def __init__(self, path: str | Path | None = None):
        self._explicit = path
        self._cache: dict[str, Any] = {}

    def _tok(self, rec_tok: str | None) -> Any:
        path = self._explicit or rec_tok
        if not path:
            return None
        if path not in self._cache:
            p = Path(path)
            p = p / "tokenizer.json" if p.is_dir() else p
            try:
                from tokenizers import Tokenizer

                self._cache[path] = Tokenizer.from_file(str(p))
            except Exception:  # noqa: BLE001 - missing/foreign tokenizer: show ids instead
                self._cache[path] = None
        return self._cache[path]

    def decode(self, rec: dict, ids: list[int]) -> str | None:
        tok = self._tok(rec.get("tokenizer"))
        return None if tok is None else tok.decode(ids, skip_special_tokens=False)


def _turn_spans(traj: TrajectoryRecord | None, rec: dict) -> list[tuple[str, int, int]]:
    """(role, start, end) of each turn; a single-turn sample is one assistant turn."""
    if traj and traj.turn_spans:
        return [(s.role, s.start, s.end) for s in sorted(traj.turn_spans, key=lambda s: s.start)]
    return [("assistant", 0, rec.get("response_length", 0))]


def _mask_pieces(rec: dict, start: int, end: int) -> list[tuple[int, int, int]]:
    """(start, end, mask) pieces of [start, end) cut along the loss-mask spans."""
    pieces = []
    for s in rec.get("loss_mask_spans") or []:
        a, b = max(start, s["start"]), min(end, s["end"])
        if a < b:
            pieces.append((a, b, int(s["mask"])))
    return pieces or [(start, end, 1)]


def _pictures_beside_answer(rec: dict) -> Text:
    """The sample's pictures as terminal cells, its answer beside them (a VLM sample at a glance)."""
    from PIL import Image, UnidentifiedImageError

    from slime.observability.image_cells import beside, thumbnail_rows

    rows: list[Text] = []
    for path in rec["images"]:
        try:
            with Image.open(path) as image:
                rows += thumbnail_rows(image)
        except (OSError, UnidentifiedImageError) as e:
            rows.append(Text(f"(cannot show {path}: {e})"[:60], style="red"))
        rows.append(Text(path.rsplit("/", 1)[-1], style="grey62"))
    t = Text(f"\n── {len(rec['images'])} image(s) · the answer ──\n", style="bold cyan")
    t.append_text(beside(rows, rec.get("output") or "", right_style="bold"))
    return t


def render_sample(rec: dict, decoder: Decoder | None = None) -> Text:
    """Header, prompt, the response turn by turn (trained green, masked grey), then tool calls and errors."""
    decoder = decoder or Decoder()
    traj = trajectory(rec)
    t = Text()
    score = rec.get("score")
    t.append(f"step {rec.get('step')}  sample {rec.get('index')}  group {rec.get('group_index')}", style="bold")
    if rec.get("dataset"):
        t.append(f"  dataset {rec['dataset']}")
    t.append(
        f"\nstatus {rec.get('status')}  score {score if score is None else round(score, 4)}"
        f"  label {rec.get('label')!r}  response {rec.get('response_length')} tokens"
        f"  turns {turns(rec)}\n"
    )
    if isinstance(rec.get("reward"), dict):
        t.append(f"reward {json.dumps(rec['reward'], ensure_ascii=False)}\n")
    if traj:
        t.append(
            f"finish {traj.finish_reason or '-'}  tool calls {json.dumps(traj.tool_calls)}"
            f"  tool errors {len(traj.tool_errors)}  parse errors {len(traj.parse_errors)}\n"
        )
        if traj.tool_rewards or traj.step_rewards:
            steps = [(s.turn, s.tool, s.reward) for s in traj.step_rewards]
            t.append(f"tool rewards {json.dumps(traj.tool_rewards)}  step rewards {steps}\n")
    t.append("\n── prompt ──\n", style="bold cyan")
    t.append(rec.get("input", "") + "\n", style="cyan")
    if rec.get("images"):
        t.append_text(_pictures_beside_answer(rec))
    tokens, plen = rec.get("tokens") or [], rec.get("prompt_length", 0)
    resp_ids = tokens[plen:] if tokens else []
    decoded_any = False
    for i, (role, a, b) in enumerate(_turn_spans(traj, rec)):
        pieces = _mask_pieces(rec, a, b)
        trained = sum(e - s for s, e, m in pieces if m)
        kind = "trained" if trained == b - a else "masked" if trained == 0 else f"trained {trained}/{b - a}"
        t.append(
            f"\n── turn {i + 1}: {role} · tokens {a}–{b} · {kind} ──\n",
            style="bold green" if trained else "bold grey62",
        )
        for s, e, m in pieces:
            text = decoder.decode(rec, resp_ids[s:e]) if resp_ids else None
            if text is None:
                continue
            decoded_any = True
            t.append(text, style="green" if m else "grey62 italic")
        t.append("\n")
    if not decoded_any:
        t.append(
            "\n── response text (no tokenizer: spans above are token offsets; pass --tokenizer) ──\n", style="bold"
        )
        t.append((rec.get("output") or "") + "\n")
    if traj and traj.tool_messages:
        t.append("\n── tool calls ──\n", style="bold magenta")
        for j, m in enumerate(traj.tool_messages):
            call = f"{m.name}({json.dumps(m.arguments, ensure_ascii=False)})" if m.name else "(unparsable call)"
            t.append(f"[{j + 1}] turn {m.turn} · {call}\n", style="magenta")
            if m.error:
                t.append(f"    error: {m.error}\n", style="red")
            resp = "(not answered)" if m.response is None else m.response
            t.append("    → " + (resp[:4000] + (" …" if len(resp) > 4000 else "")).replace("\n", "\n      ") + "\n")
    errors = (
        (
            [(e.turn, e.kind, f"{e.tool}: {e.message}") for e in traj.tool_errors]
            + [(e.turn, e.kind, f"{e.message}: {e.raw}") for e in traj.parse_errors]
        )
        if traj
        else []
    )
    if errors:
        t.append(f"\n── errors ({len(errors)}) ──\n", style="bold red")
        for turn, kind, message in errors:
            t.append(f"turn {'-' if turn is None else turn} · {kind} · {message}\n", style="red")
    return t
