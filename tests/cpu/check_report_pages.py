#!/usr/bin/env python3
"""The shipped evidence's reports in a real browser: `check_report_pages.py <fusekit> <evidence dir>`.

Renders the HTML report of every run of every store under the evidence directory (<gpu>/<suite>.db
or .db.xz, as scripts/run.sh does without a GPU) and the index page over them into a temporary directory, with the
fusekit binary under test, then loads each page in headless Chromium: the page loads, its script logs
no console message and throws nothing, and every chart (<canvas>) of the page drew at least one value
(the page's Chart.js plugin writes the count it drew into the canvas's data-points attribute after
each draw). Then the check itself is checked: a copy of a report whose charts' values are all
blanked must fail it, and so must a copy that logs to the console. One line per check; on failure, one line saying why and exit 1; exit 77
(skipped) where no Chromium is installed.
"""
import json
import lzma
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from html.parser import HTMLParser

SKIPPED = 77


class Failure(Exception):
    pass


def check(condition, what, detail=None):
    if not condition:
        raise Failure(what + (f": {detail}" if detail is not None else ""))
    print(f"ok: {what}")


class Canvases(HTMLParser):
    """The ids of a page's <canvas> elements (a <script>'s text is not markup, so strings in the
    page's script that look like canvases are not counted)."""

    def __init__(self):
        super().__init__()
        self.ids = []

    def handle_starttag(self, tag, attrs):
        if tag == "canvas":
            self.ids.append(dict(attrs).get("id", ""))


def browser():
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def load(chromium, path):
    """(dumped DOM, console and error lines) of the page after its scripts ran."""
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom",
                                 "file://" + os.path.abspath(path)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or "</html>" not in result.stdout:
        raise Failure(f"Chromium did not load {os.path.basename(path)}: {result.stderr.strip()[-300:]}")
    errors = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    return result.stdout, errors


def page_problems(chromium, path):
    """What is wrong with the page in the browser, as lines (none: it is fine)."""
    with open(path, encoding="utf-8") as f:
        canvases = Canvases()
        canvases.feed(f.read())
    dom, errors = load(chromium, path)
    problems = [f"console: {line.strip()[:200]}" for line in errors[:3]]
    for canvas in canvases.ids:
        tag = re.search(r'<canvas id="' + re.escape(canvas) + r'"[^>]*>', dom)
        points = re.search(r'data-points="(\d+)"', tag.group(0)) if tag else None
        if points is None:
            problems.append(f"chart {canvas} was not drawn")
        elif int(points.group(1)) == 0:
            problems.append(f"chart {canvas} drew nothing")
    return problems, len(canvases.ids)


def render(fusekit, evidence, out):
    """Each store's HTML report and the index over them, as scripts/run.sh writes them: the pages."""
    pages, entries = [], []
    for gpu in sorted(os.listdir(evidence)):
        folder = os.path.join(evidence, gpu)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not (name.endswith(".db") or name.endswith(".db.xz")):
                continue
            suite = name[: -len(".db.xz")] if name.endswith(".xz") else name[: -len(".db")]
            db = os.path.join(folder, name)
            if name.endswith(".xz"):
                plain = os.path.join(out, f"{gpu}-{suite}.db")
                with lzma.open(db) as src, open(plain, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                db = plain
            runs = [row[0] for row in sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute("SELECT id FROM runs ORDER BY id")]
            check(runs, f"{gpu}/{name} holds a run")
            for run in runs:  # the latest as <gpu>-<suite>.html, an earlier one as <gpu>-<suite>-run<id>.html
                page = os.path.join(out, f"{gpu}-{suite}" + ("" if run == runs[-1] else f"-run{run}") + ".html")
                result = subprocess.run([fusekit, "report", "--db", db, "--run", str(run), "--format", "html", "-o",
                                         page], capture_output=True, text=True, timeout=300)
                check(result.returncode == 0, f"fusekit report renders run {run} of {gpu}/{name}",
                      result.stderr.strip()[-300:])
                pages.append(page)
                entries.append(f"{os.path.basename(page)}={db}#{run}")
    check(pages, f"the evidence has stores ({evidence})")
    index = os.path.join(out, "index.html")
    result = subprocess.run([fusekit, "index", "-o", index] + entries, capture_output=True, text=True, timeout=120)
    check(result.returncode == 0, "fusekit index renders the index page", result.stderr.strip()[-300:])
    with open(index, encoding="utf-8") as f:
        text = f.read()
    check(all(f'href="{os.path.basename(p)}"' in text for p in pages), "the index links to every report")
    return pages + [index]


def blank_charts(path, out):
    """A copy of the report with every chart's values blanked (null): a page whose charts draw nothing."""
    with open(path, encoding="utf-8") as f:
        html = f.read()
    match = re.search(r'(<script type="application/json" id="fusekit-data">)(.*?)(</script>)', html, re.S)
    data = json.loads(match.group(2))
    for op in data.get("ops", []):
        for series in (op.get("chart") or {}).get("series", []):
            series["values"] = [None] * len(series["values"])
    text = json.dumps(data).replace("</", "<\\/")
    blank = os.path.join(out, "blank-" + os.path.basename(path))
    with open(blank, "w", encoding="utf-8") as f:
        f.write(html[: match.start(2)] + text + html[match.end(2):])
    return blank


def with_console_error(path, out):
    """A copy of the page whose last script logs an error to the console."""
    with open(path, encoding="utf-8") as f:
        html = f.read()
    end = html.rindex("</body>")
    noisy = os.path.join(out, "noisy-" + os.path.basename(path))
    with open(noisy, "w", encoding="utf-8") as f:
        f.write(html[:end] + '<script>console.error("check_report_pages probe")</script>' + html[end:])
    return noisy


def main():
    if len(sys.argv) != 3:
        print("usage: check_report_pages.py <fusekit> <evidence dir>", file=sys.stderr)
        return 2
    chromium = browser()
    if chromium is None:
        print("skipped: no Chromium installed (the reports are checked in a browser where one is)")
        return SKIPPED
    with tempfile.TemporaryDirectory() as out:
        try:
            pages = render(sys.argv[1], sys.argv[2], out)
            charted = None
            for page in pages:
                problems, charts = page_problems(chromium, page)
                check(not problems, f"{os.path.basename(page)} in Chromium: no console message, "
                      f"{charts} chart(s), each drew values", "; ".join(problems[:3]))
                if charts and charted is None and "speedup-0" in open(page, encoding="utf-8").read():
                    charted = page
            check(charted is not None, "some report has a speedup chart (for the check of the check)")
            problems, _ = page_problems(chromium, blank_charts(charted, out))
            check(any("drew nothing" in p for p in problems),
                  "a copy whose chart values are blanked fails the check (it can fail)", problems)
            problems, _ = page_problems(chromium, with_console_error(charted, out))
            check(any("check_report_pages probe" in p for p in problems),
                  "a copy that logs to the console fails the check", problems)
        except (Failure, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
            print(f"FAIL: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
