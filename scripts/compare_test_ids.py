"""Compares the tests two revisions collect, file by file, and names the commits behind every difference.

    python scripts/compare_test_ids.py BEFORE AFTER [--native-from DIR] [--out FILE.md]

Issue 25's proof "the GPU suite passes before and after with the same counts, apart from the new generic op test"
needs the counts' differences accounted for: other work adds tests between two revisions. Each revision is exported
with ``git archive`` (no build outputs, no uncommitted files) and collected with ``pytest --collect-only`` (test
ids depend on parametrization, not on the device: a GPU test is collected and then skipped without one).
``--native-from DIR`` copies the built native modules (``*.so``) of DIR's ``python/graph_executor_v2`` into both
exports, for collections that read a module's kernel table; without it none are present.

For every test function whose number of ids changed, the report names the commits in BEFORE..AFTER that added or
removed its ``def`` in that file (``git log -S``), with the issues their messages name; a function whose ``def``
stayed but whose parametrization changed gets the commits that touched its file. A function that left one file
and appeared in another, or left and appeared in one commit, is reported as moved or renamed. Files that a
collection skips as a whole (a module-level ``importorskip``) are listed: their tests are not counted here.
``--gpu-logs DIR...`` checks AFTER's collection against the per-file totals of a GPU run's pytest logs.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISSUE = re.compile(r"\bissues? #?(\d+)", re.I)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def collect(revision: str, native_from: Path | None, workdir: Path) -> tuple[list[str], list[str]]:
    """(test ids, "file: reason" of the files skipped as a whole) that ``revision`` collects."""
    tree = workdir / revision
    tree.mkdir()
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    if native_from is not None:
        for module in (native_from / "python" / "graph_executor_v2").glob("*.so"):
            shutil.copy(module, tree / "python" / "graph_executor_v2")
    result = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-p", "no:cacheprovider"],
                            cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "python"})
    lines = result.stdout.splitlines()
    if result.returncode not in (0, 5) or any(line.startswith("ERROR") for line in lines):
        raise RuntimeError(f"collection of {revision} failed:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    ids = [line for line in lines if "::" in line and not line.startswith(("SKIPPED", "ERROR"))]
    skipped = [re.sub(r"^SKIPPED \[\d+\] ", "", line) for line in lines if line.startswith("SKIPPED")]
    return ids, skipped


def by_function(ids: list[str]) -> dict[str, collections.Counter]:
    """file -> Counter(function -> number of ids)."""
    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for test_id in ids:
        path, _, rest = test_id.partition("::")
        files[path][rest.partition("[")[0]] += 1
    return files


@functools.lru_cache(maxsize=None)
def commits_changing(before: str, after: str, path: str, function: str) -> tuple[str, ...]:
    """The commits (newest first) that changed how often ``def <function>(`` occurs in ``path``."""
    needle = f"def {function.rpartition('::')[2]}("
    return tuple(git("log", "--format=%h", f"-S{needle}", f"{before}..{after}", "--", path).split())


def commits_touching(before: str, after: str, path: str, *log_options: str) -> tuple[str, ...]:
    return tuple(git("log", "--format=%h", *log_options, f"{before}..{after}", "--", path).split())


def describe(commit: str) -> str:
    message = git("log", "-1", "--format=%B", commit)
    issues = sorted(set(ISSUE.findall(message)), key=int)
    subject = message.splitlines()[0]
    return (f"{commit} ({', '.join('issue ' + i for i in issues) or 'no issue named'}): {subject[:150]}"
            f"{'...' if len(subject) > 150 else ''}")


def gpu_log_totals(directories: list[Path]) -> dict[str, int]:
    """tests/<file>.py -> the ids its pytest logs ran (``<file>.log`` or shards ``<file>.<n>.log``): the last
    summary line's passed, failed, skipped, xfailed, xpassed and errors, summed over the shards."""
    totals: dict[str, int] = collections.Counter()
    for directory in directories:
        for log in sorted(directory.glob("*.log")):
            summaries = [line for line in log.read_text(errors="replace").splitlines()
                         if re.search(r"\d+ (passed|failed|skipped|xfailed|error)", line)]
            if summaries:
                counts = re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)\b", summaries[-1])
                totals[f"tests/{log.name.split('.')[0]}.py"] += sum(int(count) for count, _ in counts)
    return totals


def compare(before: str, after: str, native_from: Path | None, gpu_logs: list[Path]) -> str:
    with tempfile.TemporaryDirectory(prefix="ge2_test_ids_") as workdir:
        before_ids, before_skipped = collect(before, native_from, Path(workdir))
        after_ids, after_skipped = collect(after, native_from, Path(workdir))
    old, new = by_function(before_ids), by_function(after_ids)
    removed = {(path, name) for path in old for name in old[path] if name not in new.get(path, {})}
    added = {(path, name) for path in new for name in new[path] if name not in old.get(path, {})}
    named: set[str] = set()  # the commits the report names, described at its end
    by_file: dict[str, set[str]] = collections.defaultdict(set)
    left, grew, added_by = [], [], collections.defaultdict(list)
    generated: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])  # owner -> [ids, functions]
    generated_by: dict[str, tuple[str, ...]] = {}
    for path, name in sorted(removed | added | {(p, n) for p in old for n in old[p] if n in new.get(p, {})}):
        a, b = old.get(path, {}).get(name, 0), new.get(path, {}).get(name, 0)
        if a == b:
            continue
        if a and b:
            commits = commits_touching(before, after, path)
            why = (f"the commits that touched the file: {', '.join(reversed(commits))}" if commits else
                   "no commit touched the file: its parameters come from outside it (an imported list)")
            (grew if b > a else left).append(f"- {path}::{name}: {a} -> {b} ({why})")
        elif b:  # a new test function (or one that came from another file)
            commits = commits_changing(before, after, path, name)
            if not commits:  # no ``def`` of that name: generated (a backend test runner's class)
                owner = f"{path}::{name.rpartition('::')[0] or name}"
                generated[owner][0] += b
                generated[owner][1] += 1
                commits = commits_touching(before, after, path)
                generated_by[owner] = commits
                by_file[path] |= set(commits)
                continue
            moved = sorted(p for p, n in removed if n == name and p != path)
            added_by[commits[-1]].append(f"{path}::{name} (+{b}{', moved from ' + ', '.join(moved) if moved else ''})")
        else:  # gone from this file
            commits = commits_changing(before, after, path, name)
            moved = sorted(p for p, n in added if n == name and p != path)
            partners = sorted(n for p, n in added if p == path and set(commits) & set(commits_changing(
                before, after, path, n)))
            how = (f"moved to {', '.join(moved)}" if moved else
                   f"renamed or split into {', '.join(partners)} in the same commit" if partners else "removed")
            left.append(f"- {path}::{name}: {a} -> 0, {how} ({', '.join(reversed(commits)) or 'no commit found'})")
        by_file[path] |= set(commits)
        named |= set(commits)
    named |= set(added_by) | {commit for commits in generated_by.values() for commit in commits}
    lines = [f"# Collected test ids, {before} -> {after}", "",
             f"`python scripts/compare_test_ids.py {before} {after}"
             f"{' --native-from ' + str(native_from) if native_from else ''}` (pytest --collect-only on each "
             f"revision's `git archive`; what the report says is read from git: `git log -S'def <test>('` for a "
             f"test function that came or went, the commits that touched a file for a parametrization that changed).",
             "", f"Total: {len(before_ids)} -> {len(after_ids)} ({len(after_ids) - len(before_ids):+d}).", "",
             "## Per file (files whose ids changed)", "", "| file | before | after | change | commits |",
             "|---|---|---|---|---|"]
    for path in sorted(set(old) | set(new)):
        count_old, count_new = sum(old.get(path, {}).values()), sum(new.get(path, {}).values())
        if old.get(path) != new.get(path):
            commits = ", ".join(sorted(by_file[path])[:6]) + (" ..." if len(by_file[path]) > 6 else "")
            lines.append(f"| {path} | {count_old} | {count_new} | {count_new - count_old:+d} | {commits} |")
    lines += ["", "## Ids that left: tests removed, renamed or split, or fewer parametrizations", "",
              *(left or ["none"])]
    kept = set(before_ids) & set(after_ids)
    renamed_ids = collections.Counter()  # functions still there, some of whose before ids are not
    for test_id in set(before_ids) - kept:
        path, _, rest = test_id.partition("::")
        function = rest.partition("[")[0]
        if new.get(path, {}).get(function, 0):
            renamed_ids[f"{path}::{function}"] += 1
    lines += ["", f"Of the {len(before_ids)} ids before, {len(kept)} are collected after under the same id; the "
                  f"{len(before_ids) - len(kept)} others are those of the tests that left (above) and these, of "
                  f"tests still there whose parameter ids changed:",
              *(f"- {function}: {count} of its {old[function.partition('::')[0]][function.partition('::')[2]]} "
                f"ids before not under the same id ({new[function.partition('::')[0]][function.partition('::')[2]]} "
                f"ids after)" for function, count in sorted(renamed_ids.items()))]
    lines += ["", "## Parametrizations that grew", "", *(grew or ["none"])]
    lines += ["", "## New test functions, by the commit that added them (oldest first)", ""]
    order = {commit: index for index, commit in enumerate(git("log", "--format=%h", f"{before}..{after}").split())}
    for commit in sorted(added_by, key=lambda c: -order.get(c, -1)):
        total = sum(int(re.search(r"\(\+(\d+)", entry).group(1)) for entry in added_by[commit])
        lines.append(f"- {commit}: +{total}: {'; '.join(added_by[commit])}")
    for owner, (count, functions) in sorted(generated.items()):
        lines.append(f"- {owner}: +{count} ids in {functions} test functions with no `def` in the file (generated, "
                     f"e.g. by a backend test runner); the commits that touched the file: "
                     f"{', '.join(reversed(generated_by[owner]))}")
    lines += ["", "## Files a collection skipped as a whole (not counted above)", "",
              f"- before: {'; '.join(before_skipped) or 'none'}", f"- after: {'; '.join(after_skipped) or 'none'}"]
    if gpu_logs:
        ran = gpu_log_totals(gpu_logs)
        collected = {path: sum(functions.values()) for path, functions in new.items()}
        lines += ["", f"## The GPU logs' totals against {after}'s collection here", "",
                  f"Logs: {', '.join(map(str, gpu_logs))}.", "", "| file | collected here | ran on the GPU |",
                  "|---|---|---|"]
        lines += [f"| {path} | {collected.get(path, 0)} | {ran.get(path, 0)} |"
                  for path in sorted(set(ran) | set(collected)) if collected.get(path, 0) != ran.get(path, 0)]
        lines.append(f"\nEvery other file: the same number. Totals: {sum(collected.values())} collected here, "
                     f"{sum(ran.values())} ran on the GPU.")
    lines += ["", "## The commits named above", "", *(f"- {describe(commit)}" for commit in
                                                         sorted(named, key=lambda c: -order.get(c, -1)))]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--native-from", type=Path, help="a checkout whose built native modules both exports get")
    parser.add_argument("--gpu-logs", type=Path, nargs="*", default=[],
                        help="directories of per-file pytest logs (<file>.log, <file>.<shard>.log) of AFTER's GPU run: "
                             "their totals are checked against AFTER's collection")
    parser.add_argument("--out", type=Path, help="write the report here (default: stdout)")
    args = parser.parse_args(argv)
    report = compare(git("rev-parse", "--short", args.before).strip(), git("rev-parse", "--short", args.after).strip(),
                     args.native_from, args.gpu_logs)
    if args.out:
        args.out.write_text(report)
        print(f"wrote {args.out}")
    else:
        print(report, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
