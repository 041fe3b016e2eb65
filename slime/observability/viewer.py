"""RolloutViewer: a textual app over a rollout dump directory (JSONL dumps and `.pt` debug files).

Left: the steps (train, eval per dataset, debug). Top: a query box (free text plus
`status:`, `dataset:`, `tool:`, `score>`, `len<`, `turns>=`, `errors>`). Middle: the samples of the
step, sortable. Bottom: the selected sample turn by turn. Keys are listed in the footer.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Header, Input, OptionList, Static

from slime.observability import viewer_data as V


class RolloutViewer(App):
    TITLE = "slime rollout viewer"
    CSS = """
    #steps { width: 28; }
    #samples { height: 40%; }
    #detail-box { height: 1fr; border-top: solid $accent; }
    #status { height: 1; background: $panel; }
    """
    BINDINGS = [
        Binding("slash", "focus_query", "search/filter"),
        Binding("escape", "focus_table", "samples", show=False),
        Binding("right_square_bracket", "step(1)", "next step"),
        Binding("left_square_bracket", "step(-1)", "prev step"),
        Binding("j", "sample(1)", "next sample"),
        Binding("k", "sample(-1)", "prev sample"),
        Binding("s", "cycle_sort", "sort"),
        Binding("r", "reload", "reload"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, root: str | Path | list[str | Path], tokenizer: str | None = None):
        super().__init__()
        self.dump_root = [Path(r) for r in root] if isinstance(root, (list, tuple)) else Path(root)
        self.decoder = V.Decoder(tokenizer)
        self.sources: list[V.Source] = []
        self.step_index = -1
        self.loaded = V.Loaded()
        self.query_text = ""
        self.sort_mode = V.SORTS[0]
        self.rows: list[dict] = []
        self.current_record: dict | None = None
        self.detail_plain = ""
        self.status_plain = ""

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield OptionList(id="steps")
            with Vertical():
                yield Input(
                    placeholder='search  status:truncated  dataset:x  tool:y  score>0  len<500  errors>0  "a phrase"',
                    id="query",
                )
                yield DataTable(id="samples", cursor_type="row", zebra_stripes=True)
                with VerticalScroll(id="detail-box"):
                    yield Static(id="detail")
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#samples", DataTable)
        table.add_columns("#", "group", "score", "status", "dataset", "len", "turns", "tools", "errors", "output")
        self.action_reload()

    # ------------------------------------------------------------------ data flow
    def action_reload(self) -> None:
        self.sources = V.discover(self.dump_root)
        steps = self.query_one("#steps", OptionList)
        steps.clear_options()
        steps.add_options([s.label for s in self.sources])
        if self.sources:
            self.select_step(min(max(self.step_index, 0), len(self.sources) - 1))
        else:
            self.step_index = -1
            self.loaded = V.Loaded()
            self.refresh_samples()

    def select_step(self, i: int) -> None:
        if not self.sources:
            return
        i = max(0, min(i, len(self.sources) - 1))
        self.step_index = i
        steps = self.query_one("#steps", OptionList)
        if steps.highlighted != i:
            steps.highlighted = i
        self.loaded = V.load(self.sources[i])
        self.refresh_samples()

    def refresh_samples(self) -> None:
        q = V.parse_query(self.query_text)
        recs = [r for r in self.loaded.records if V.matches(r, q)]
        self.rows = V.sort_records(recs, self.sort_mode)
        table = self.query_one("#samples", DataTable)
        table.clear()
        for n, r in enumerate(self.rows):
            score = r.get("score")
            preview = (r.get("output") or "").replace("\n", " ")[:80]
            table.add_row(
                str(r.get("index")),
                str(r.get("group_index")),
                "-" if score is None else f"{score:.3g}",
                str(r.get("status")),
                r.get("dataset") or "",
                str(r.get("response_length")),
                str(V.turns(r)),
                str(sum(V.tool_calls(r).values())),
                str(V.error_count(r)),
                preview,
                key=str(n),
            )
        self.show_sample(0 if self.rows else None)
        src = self.sources[self.step_index].label if 0 <= self.step_index < len(self.sources) else "-"
        msg = f"{src}: {len(self.rows)}/{len(self.loaded.records)} samples · sort {self.sort_mode}"
        if self.query_text:
            msg += f" · filter {self.query_text!r}"
        if self.loaded.bad_lines:
            msg += f" · {self.loaded.bad_lines} unreadable line(s) skipped"
        if self.loaded.error:
            msg += f" · cannot read file: {self.loaded.error}"
        if not self.loaded.records and not self.loaded.error and self.sources:
            msg += " · empty file"
        roots = self.dump_root if isinstance(self.dump_root, list) else [self.dump_root]
        self.set_status(msg if self.sources else f"no rollout dumps in {', '.join(map(str, roots))}")

    def show_sample(self, n: int | None) -> None:
        detail = self.query_one("#detail", Static)
        if n is None or not (0 <= n < len(self.rows)):
            self.current_record = None
            self.detail_plain = "(no sample)"
            detail.update(self.detail_plain)
            return
        self.current_record = self.rows[n]
        text = V.render_sample(self.current_record, self.decoder)
        self.detail_plain = text.plain
        detail.update(text)

    def set_status(self, msg: str) -> None:
        self.status_plain = msg
        self.query_one("#status", Static).update(msg)

    # ------------------------------------------------------------------ events
    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id == "steps" and event.option_index != self.step_index:
            self.select_step(event.option_index)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_sample(event.cursor_row)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_text = event.value.strip()
        self.refresh_samples()
        self.action_focus_table()

    # ------------------------------------------------------------------ actions
    def action_focus_query(self) -> None:
        self.query_one("#query", Input).focus()

    def action_focus_table(self) -> None:
        self.query_one("#samples", DataTable).focus()

    def action_step(self, delta: int) -> None:
        self.select_step(self.step_index + delta)

    def action_sample(self, delta: int) -> None:
        table = self.query_one("#samples", DataTable)
        if self.rows:
            table.move_cursor(row=max(0, min(table.cursor_row + delta, len(self.rows) - 1)))

    def action_cycle_sort(self) -> None:
        self.sort_mode = V.SORTS[(V.SORTS.index(self.sort_mode) + 1) % len(V.SORTS)]
        self.refresh_samples()
