"""The compile report: the trace's journal (kiln/trace/__init__.py) and the run folder's dumps as
one self-contained HTML page — no server, no file beside it, opens from disk.

Sections, in the order a reader asks: where capture stopped (graph breaks with the user's line of
code), why it compiled again (recompiles and the guard that failed), what runs eagerly (fallbacks
with reasons), what was captured (each frame's entries, graphs and guards), then per compiled graph
what each stage made of it (each pass's change to the ATen graph as a diff, the IR, every kernel's
loop nest beside its code, the wrapper), the autotuning questions with every candidate's time, and
the compile-time trees. Every text is escaped; the page's only script expands and collapses.
"""

from __future__ import annotations

import difflib
import html
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import torch

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 2em 4em;color:#1d1d1f;max-width:110em}
h1{font-size:1.6em;margin:.8em 0 .2em}h2{margin-top:1.6em;border-bottom:1px solid #ccc}
h3{margin:1.2em 0 .3em;font-size:1.05em}
pre{background:#f6f8fa;padding:.6em;overflow:auto;font:12px/1.35 ui-monospace,monospace;margin:.3em 0}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ddd;padding:.25em .5em;vertical-align:top;text-align:left}
th{background:#f0f0f0}code{font:12px ui-monospace,monospace;background:#f6f8fa}
summary{cursor:pointer}details{margin:.2em 0 .2em 1em}.muted{color:#777}.bad{color:#b00020}
.add{color:#116329;background:#e6ffec}.del{color:#82071e;background:#ffebe9}.hunk{color:#6639ba}
nav a{margin-right:1em}
"""

# Expand/collapse all, and a link to a section inside closed blocks (#003_kiln_backend) opens them.
_SCRIPT = """
function setAll(open){document.querySelectorAll('details').forEach(function(d){d.open=open;});}
function openTarget(){var t=location.hash&&document.getElementById(decodeURIComponent(location.hash.slice(1)));
for(var e=t;e;e=e.parentElement){if(e.tagName==='DETAILS'){e.open=true;}}}
window.addEventListener('hashchange',openTarget);
document.addEventListener('DOMContentLoaded',function(){openTarget();
document.getElementById('summary').textContent+=' \u2014 '+document.querySelectorAll('details').length+' blocks';});
"""


def render(events: list[Any], run_folder: Path) -> str:
    """The whole page for the journal `events` (kiln.trace.Event) of the process whose dumps are
    under `run_folder`."""
    by_kind: dict[str, list[dict]] = {}
    for event in events:
        by_kind.setdefault(event.kind, []).append(event.fields)
    kernels_by_folder = {e["folder"]: e for e in by_kind.get("kernels", []) if e.get("folder")}
    sections = [
        ("breaks", "Graph breaks", _breaks(by_kind.get("break", []))),
        ("recompiles", "Recompiles", _recompiles(by_kind.get("recompile", []))),
        ("fallbacks", "Fallbacks to eager", _fallbacks(by_kind.get("fallback", []), by_kind.get("eager_frame", []))),
        ("frames", "Frames captured", _frames(by_kind.get("entry", []))),
        ("graphs", "Compiled graphs, stage by stage", _graphs(by_kind.get("dump", []), kernels_by_folder,
                                                               [e for e in by_kind.get("kernels", []) if not e.get("folder")])),
        ("autotune", "Autotuning", _autotune(by_kind.get("autotune", []))),
        ("compile-time", "Compile time", _compile_time(by_kind.get("compile_time", []))),
    ]
    counts = [f"{len(by_kind.get('entry', []))} frame entr{'y' if len(by_kind.get('entry', [])) == 1 else 'ies'}",
              f"{sum(e['resumed'] for e in by_kind.get('break', []))} graph break(s)",
              f"{len(by_kind.get('recompile', []))} recompile(s)",
              f"{len(by_kind.get('fallback', [])) + len(by_kind.get('eager_frame', []))} fallback(s)",
              f"{sum(len(e['kernels']) for e in by_kind.get('kernels', []))} kernel(s)",
              f"{len(by_kind.get('autotune', []))} autotuning question(s)"]
    nav = " ".join(f'<a href="#{anchor}">{_e(title)}</a>' for anchor, title, _ in sections)
    body = "\n".join(f'<h2 id="{anchor}">{_e(title)}</h2>\n{content}' for anchor, title, content in sections)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kiln compile report</title>"
            f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>\n"
            f"<h1>kiln compile report</h1>\n<p>{_e(_process())}</p>\n<p><b id='summary'>{_e(', '.join(counts))}</b></p>\n"
            f"<nav>{nav} <button onclick=\"setAll(true)\">expand all</button>"
            f"<button onclick=\"setAll(false)\">collapse all</button></nav>\n{body}\n</body></html>\n")


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _pre(text: str, css: str = "") -> str:
    return f'<pre{f" class={css!r}" if css else ""}>{_e(text)}</pre>'


def _details(summary: str, content: str, open_: bool = False) -> str:
    """A collapsible block; `summary` is HTML already escaped."""
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{content}</details>"


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    """A table; cells are HTML already escaped."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _none(what: str) -> str:
    return f'<p class="muted">{_e(what)}</p>'


def _process() -> str:
    return (f"process {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}, `{' '.join(sys.argv)[:200]}`; "
            f"Python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}")


# --- capture --------------------------------------------------------------------------------


def _frames(entries: list[dict]) -> str:
    if not entries:
        return _none("No frame was captured by kiln's capture (behind torch.compile, Dynamo captures).")
    rows = []
    for entry in entries:
        stats = entry["stats"]
        blocks = [_details(f"guards ({len(entry['guards'])})", _pre("\n".join(entry["guards"]))),
                  _details("runner (the Python that calls the graph)", _pre(entry["runner"]))]
        if entry["graph"]:
            blocks.insert(0, _details(f"graph ({stats.get('ops', '?')} ops)", _pre(entry["graph"])))
        else:
            blocks.insert(0, '<span class="muted">no graph: Python only</span>')
        ended = f'<span class="bad">{_e(entry["ended_by"])}</span>' if entry["ended_by"] else ""
        rows.append([f"<b>{_e(entry['frame'])}</b>", _e(entry["entry"]), f"{entry['seconds']:.2f}",
                     _e(", ".join(f"{k} {v}" for k, v in stats.items())), "".join(blocks), ended])
    return _table(["frame", "entry", "capture s", "size", "what it made", "ended by a graph break"], rows)


def _breaks(breaks: list[dict]) -> str:
    if not breaks:
        return _none("No graph break and no frame run eagerly.")
    rows = []
    for b in breaks:
        where = f"{b['filename']}:{b['lineno']}" + (f" in {b['function']}" if b["function"] else "")
        rows.append([_e(b["kind"]), f"<code>{_e(where)}</code>", f"<code>{_e(b['source'])}</code>", _e(b["explanation"]),
                     _e(b["hint"]), "graph break, resumed after it" if b["resumed"] else '<span class="bad">frame runs eagerly</span>'])
    return _table(["kind", "where", "source line", "why", "hint", "effect"], rows)


def _recompiles(recompiles: list[dict]) -> str:
    if not recompiles:
        return _none("No recompile.")
    return _table(["frame", "entry", "reason"], ([_e(r["frame"]), _e(r["entry"]), _e(r["reason"])] for r in recompiles))


def _fallbacks(graphs: list[dict], frames: list[dict]) -> str:
    if not graphs and not frames:
        return _none("Nothing fell back to eager.")
    rows = [[_e(f"{g['backend']}: graph {g['graph']}"), _e(g["reason"]), _pre(g["detail"])] for g in graphs]
    rows += [[_e(f"frame {f['frame']}"), _e(f["record"]), ""] for f in frames]
    return _table(["what", "reason", "detail"], rows)


# --- the backend's stages -------------------------------------------------------------------

_NUMBERED = re.compile(r"^(\d\d)_(.*)$")
_GRAPH_FILES = ("captured_graph.py", "aten_inference.py", "aten_forward.py", "aten_graph.py")


def _graphs(dumps: list[dict], kernels_by_folder: dict[str, dict], unplaced: list[dict]) -> str:
    if not dumps and not unplaced:
        return _none("No graph was compiled.")
    parts = []
    for dump in dumps:
        folder = Path(dump["path"])
        files = _files(folder)
        inner = _stage_files(files)
        kernels = kernels_by_folder.get(dump["path"])
        if kernels is not None:
            inner += _kernels(kernels)
        parts.append(f'<h3 id="{_e(folder.name)}">{_e(folder.name)}</h3>' + (inner or _none("(no files)")))
    parts += [_kernels(k) for k in unplaced]
    return "\n".join(parts)


def _files(folder: Path) -> list[tuple[str, str]]:
    """(stage name, text) of each dump file, in the order written."""
    found = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _NUMBERED.match(path.name)
        if match and path.is_file():
            found.append((match.group(2), path.read_text(encoding="utf-8", errors="replace")))
    return found


def _stage_files(files: list[tuple[str, str]]) -> str:
    """Each file as a block; a pass's graph as its diff against the graph before it."""
    out, previous = [], None
    for name, text in files:
        if name.startswith("pass_") and previous is not None and not name.startswith("pass_split_constants"):
            pass_name = name.removeprefix("pass_").removesuffix(".py")
            diff = _diff(previous, text)
            if diff is None:
                out.append(f'<div class="muted">pass {_e(pass_name)}: no change</div>')
            else:
                added = sum(line.startswith("+") for line in diff)
                removed = sum(line.startswith("-") for line in diff)
                out.append(_details(f"pass <b>{_e(pass_name)}</b>: +{added} −{removed} lines",
                                    _diff_html(diff) + _details("graph after it", _pre(text))))
            previous = text
            continue
        if name in _GRAPH_FILES:
            previous = text
        out.append(_details(_e(name), _pre(text)))
    return "".join(out)


def _diff(before: str, after: str) -> list[str] | None:
    # The first line is the file's header (which pass wrote it): not part of the graph.
    a, b = before.splitlines()[1:], after.splitlines()[1:]
    lines = list(difflib.unified_diff(a, b, lineterm="", n=2))[2:]
    return lines or None


def _diff_html(lines: list[str]) -> str:
    css = {"+": "add", "-": "del", "@": "hunk"}
    rendered = []
    for line in lines:
        kind = css.get(line[:1])
        rendered.append(f'<span class="{kind}">{_e(line)}</span>' if kind else _e(line))
    return "<pre>" + "\n".join(rendered) + "</pre>"


def _kernels(listing: dict) -> str:
    rows = []
    for k in listing["kernels"]:
        summary = (f"<code>{_e(k['function'])}</code> ({_e(k['kernel'])}"
                   f"{', vectorized' if k['vectorized'] else ''})")
        rows.append(_details(summary, "<b>loop nest</b>" + _pre(k["loops"]) + f"<b>{_e(listing['codegen'])} code</b>" + _pre(k["code"])))
    return _details(f"<b>kernels</b> ({len(listing['kernels'])}, {_e(listing['codegen'])})", "".join(rows), open_=True)


# --- tuning and time ------------------------------------------------------------------------


def _autotune(questions: list[dict]) -> str:
    if not questions:
        return _none("No autotuning question was asked.")
    rows = []
    for q in questions:
        times = q["seconds"]
        best = min(times.values()) if times else None
        cells = []
        for name in q["candidates"]:
            if name in times:
                text = f"{_e(name)} {times[name] * 1e3:.3f} ms"
                cells.append(f"<b>{text}</b>" if name == q["choice"] else text)
            else:
                cells.append(f"<b>{_e(name)}</b>" if name == q["choice"] else _e(name))
        ratio = f" ({times[q['choice']] / best:.2f}× the fastest)" if best and q["choice"] in times else ""
        rows.append([_e(q["op"]), f"<code>{_e(q['signature'])}</code>", "<br>".join(cells), _e(q["choice"]) + _e(ratio),
                     _e(q["answered"])])
    return _table(["op", "question", "candidates (time of one run)", "chosen", "answered"], rows)


def _compile_time(trees: list[dict]) -> str:
    if not trees:
        return _none("No compile finished.")
    return "".join(_pre(t["tree"]) for t in trees)
