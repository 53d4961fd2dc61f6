"""docs/results/quality.md from benchmarks/quality.py's JSON (rerun alone to re-render it).

    python -m benchmarks.quality_report docs/results/quality.json
    python -m benchmarks.quality_report --merge OUT.json [--note TEXT] PART.json...   # runs split by --only
    python -m benchmarks.quality_report --merge OUT.json --study [--note TEXT] PART.json...   # a settings study:
        # the table only (no targets, no notes: its rows are read in quality_notes.md)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NOTES_FILE = Path(__file__).with_name("quality_notes.md")


def recovered_fraction(dense: float, rtn: float, improved: float) -> float:
    """Share of RTN's perplexity increase over dense that the improved method removes."""
    return (rtn - improved) / (rtn - dense)


def write_report(report: dict, md_path: Path, json_path: Path, *, study: bool = False) -> None:
    json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report, study=study), encoding="utf-8")


def _ppl(rows: list[dict], label: str, text: str = "all") -> float | None:
    row = next((r for r in rows if r["label"] == label), None)
    return row["perplexity"][text] if row else None


def _bits(rows: list[dict], label: str) -> float | None:
    row = next((r for r in rows if r["label"] == label), None)
    return row["bits"]["overall"] if row else None


def _best(rows: list[dict], family: str, prefix: str) -> dict | None:
    """The lowest-perplexity row of ``family`` whose label starts with ``prefix``."""
    return min((r for r in rows if r["family"] == family and r["label"].startswith(prefix)),
               key=lambda r: r["perplexity"]["all"], default=None)


def _verdict(ours: float, theirs: float) -> str:
    return "met" if ours <= theirs else f"missed by {ours / theirs - 1:+.1%}"


def _row(rows: list[dict], family: str, label: str) -> dict | None:
    return next((r for r in rows if r["family"] == family and r["label"] == label), None)


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, each with its numbers and whether it is met."""
    return [*_w4_target(rows), *_mixed_target(rows), *_mlp3_target(rows)]


def _ppl_all(row: dict) -> float:
    return row["perplexity"]["all"]


def _w4_target(rows: list[dict]) -> list[str]:
    w4 = _best(rows, "ours", "w4 ")
    q40 = _row(rows, "llama.cpp", "Q4_0 + imatrix")
    if not (w4 and q40):
        return ["- `w4` at or below llama.cpp Q4_0 + imatrix at <= its bits/weight: not measured in this run"]
    ok = _ppl_all(w4) <= _ppl_all(q40) and w4["bits"]["overall"] <= q40["bits"]["overall"]
    lines = [f"- our best `w4` ({w4['label']}, {w4['bits']['overall']:.2f} bpw) at or below llama.cpp "
             f"Q4_0 + imatrix ({q40['bits']['overall']:.2f} bpw): {_ppl_all(w4):.3f} vs "
             f"{_ppl_all(q40):.3f}: {'met' if ok else _verdict(_ppl_all(w4), _ppl_all(q40))}"]
    pure = _row(rows, "llama.cpp", "Q4_0 --pure + imatrix")
    if pure:
        lines.append(f"  - at equal bits everywhere (Q4_0 --pure + imatrix, {pure['bits']['overall']:.2f} bpw): "
                     f"{_ppl_all(w4):.3f} vs {_ppl_all(pure):.3f}: {_verdict(_ppl_all(w4), _ppl_all(pure))}")
        control = _best(rows, "control", "")
        if control:  # the same 32-wide grid and size as Q4_0 --pure: method against method
            lines.append(f"  - method against method on Q4_0's grid (the control, {control['label']}): "
                         f"{_ppl_all(control):.3f} vs {_ppl_all(pure):.3f}: {_verdict(_ppl_all(control), _ppl_all(pure))}")
    method = w4["label"].removeprefix("w4 ")
    same = _row(rows, "control", f"all 4-bit, 32-wide groups, {method}")
    if same:  # one method, two group widths: what the 128-wide group costs on this 32-wide-grid source
        lines.append(f"  - {method} at 32-wide groups (control) vs 128-wide (`w4`): {_ppl_all(same):.3f} vs "
                     f"{_ppl_all(w4):.3f}: the 128-wide group costs {_ppl_all(w4) / _ppl_all(same) - 1:+.1%}")
    return lines


def _mixed_target(rows: list[dict]) -> list[str]:
    mixed = _best(rows, "ours", "mixed")
    three = [r for r in rows if r["family"] == "llama.cpp" and r["label"].startswith("Q3")
             and r["bits"]["overall"] >= (mixed["bits"]["overall"] if mixed else 99)]
    if not (mixed and three):
        return ["- our `mixed` closer to S than llama.cpp's best 3-bit mix of equal or larger size: "
                "not measured in this run"]
    best = min(three, key=_ppl_all)
    lines = [f"- our best `mixed` ({mixed['label']}, {mixed['bits']['overall']:.2f} bpw) closer to S than "
             f"llama.cpp's best 3-bit mix of equal or larger size ({best['label']}, "
             f"{best['bits']['overall']:.2f} bpw): {_ppl_all(mixed):.3f} vs {_ppl_all(best):.3f}: "
             f"{_verdict(_ppl_all(mixed), _ppl_all(best))}"]
    for r in sorted(three, key=_ppl_all):
        if r["extra"].get("types"):  # what llama.cpp's "3-bit" mix really stores on this model
            lines.append(f"  - {r['label']} stores: " + ", ".join(
                f"{role} {'/'.join(sorted(types))}" for role, types in sorted(r["extra"]["types"].items())))
    return lines


def _mlp3_target(rows: list[dict]) -> list[str]:
    dense, rtn = _ppl(rows, "S (fp16)"), _ppl(rows, "mlp3-only rtn")
    improved = [r for r in rows if r["label"].startswith("mlp3-only ") and r["label"] != "mlp3-only rtn"]
    if not (rtn and dense and improved and rtn > dense):
        return ["- 3-bit MLP layers recover >= 50 % of RTN's gap: not measured in this run"]
    lines = [f"- 3-bit MLP layers recover >= 50 % of RTN's gap (only the MLP quantized, 3-bit; every other "
             f"weight fp16; S {dense:.3f}, rtn {rtn:.3f}):"]
    for r in sorted(improved, key=_ppl_all):
        frac = recovered_fraction(dense, rtn, _ppl_all(r))
        lines.append(f"  - {r['label'].removeprefix('mlp3-only ')} {_ppl_all(r):.3f} removes "
                     f"{frac:.0%}: {'met' if frac >= 0.5 else 'missed'}")
    return lines


def markdown(report: dict, *, study: bool = False) -> str:
    """The report as markdown: header, table, the issue's targets and the notes (a ``study``: header and table)."""
    rows = report["results"]
    dense = _ppl(rows, "S (fp16)")
    texts = [t for t in rows[0]["perplexity"] if t != "all"]
    tokens = ", ".join(f"{t}: {rows[0]['tokens'][t]} tokens" for t in texts)
    llamacpp = f", llama.cpp {report['llamacpp']}" if report["llamacpp"] else ""
    imatrix = " (ours and llama.cpp's imatrix)" if llamacpp else ""
    header = (f"{report['date']}, commit {report['commit']}, {report['machine']}, torch {report['torch']}"
              f"{llamacpp}. Model: {report['model']}. Calibration{imatrix}: {report['calibration']}. "
              f"Held-out: {', '.join(report['heldout'].values())} ({tokens}), "
              f"non-overlapping windows of {report['window']}, one evaluator (our CPU engine, fp32) for every "
              "row. Lower is better. Generated by `python -m benchmarks.quality`"
              + (f" in {report['merged_from_runs']} parts joined by `python -m benchmarks.quality_report --merge`."
                 if report.get("merged_from_runs", 1) > 1 else "."))
    title = "Quantization settings study" if study else "Quantization quality"
    lines = [f"# {title}: {report['model']}", "", header, ""]
    if report.get("note"):
        lines += [f"**{report['note']}**", ""]
    lines += [
             "| family | variant | bits/weight linear / tables / all | " + " | ".join(f"ppl {t}" for t in texts)
             + " | ppl all | vs S |",
             "|---|---|---|" + "---:|" * (len(texts) + 2)]
    for r in sorted(rows, key=lambda r: (r["family"] != "dense", r["perplexity"]["all"])):
        b = r["bits"]
        lines.append(f"| {r['family']} | {r['label']} | {b['linear']:.2f} / {b['tables']:.2f} / {b['overall']:.2f} | "
                     + " | ".join(f"{r['perplexity'][t]:.3f}" for t in texts)
                     + f" | {r['perplexity']['all']:.3f} | "
                     + (f"{r['perplexity']['all'] / dense - 1:+.1%} |" if dense else "- |"))
    if study:
        return "\n".join(lines) + "\n"
    lines += ["", "## Targets (issue 36)", "", *targets(rows), ""]
    notes = NOTES_FILE.read_text(encoding="utf-8") if NOTES_FILE.is_file() else ""
    return "\n".join(lines) + "\n" + notes


def merge(parts: list[dict]) -> dict:
    """One report from runs that split the variants between them (``--only``, ``--ours``).

    Each run's commit is kept with what it measured. The dense row is measured by every run;
    they must agree (same weights, same evaluator; to 4 decimals), else the runs are not comparable.
    """
    dense = [r for p in parts for r in p["results"] if r["family"] == "dense"]
    if not dense:
        raise SystemExit("no run measured the dense model")
    # to 4 decimals: fp32 sums in another thread split differ in the 7th digit
    if len({json.dumps({k: round(v, 4) for k, v in r["perplexity"].items()}, sort_keys=True) for r in dense}) != 1:
        raise SystemExit("the runs disagree on the dense model's perplexity")
    merged = dict(next(p for p in parts if any(r["family"] == "dense" for r in p["results"])))
    merged["llamacpp"] = next((p["llamacpp"] for p in parts if p["llamacpp"]), None)
    seen, rest = set(), []
    for r in (r for p in parts for r in p["results"] if r["family"] != "dense"):
        if (r["family"], r["label"]) not in seen:  # a variant two parts both measured: the first
            seen.add((r["family"], r["label"]))
            rest.append(r)
    merged["results"] = dense[:1] + rest
    merged["commit"] = ", ".join(sorted({c for p in parts for c in p["commit"].split(", ")}))
    merged["merged_from_runs"] = sum(p.get("merged_from_runs", 1) for p in parts)  # a merged part counts its runs
    return merged


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    if args[0] == "--merge":  # --merge OUT.json [--note TEXT] PART.json...
        out, rest = Path(args[1]), args[2:]
        note, study = None, False
        while rest[:1] in (["--note"], ["--study"]):
            if rest[0] == "--study":
                study, rest = True, rest[1:]
            else:
                note, rest = rest[1], rest[2:]
        merged = merge([json.loads(Path(a).read_text(encoding="utf-8")) for a in rest])
        if note is not None:  # replaces the parts' note; --note "" drops it
            merged["note"] = note
        write_report(merged, out.with_suffix(".md"), out, study=study)
        return 0
    path = Path(args[0])
    report = json.loads(path.read_text(encoding="utf-8"))
    path.with_suffix(".md").write_text(markdown(report), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
