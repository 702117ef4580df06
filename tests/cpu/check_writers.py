#!/usr/bin/env python3
"""Reads the writers' output with Python's own parsers: run as `python3 check_writers.py <writers_dump>`.

The dumper writes a sample report (tests/cpu/writers_dump.cpp: 4 cases, 24 kernels, names with commas,
quotes, pipes and "</script>") into a temporary directory. This script checks that the HTML fetches nothing
when viewed, holds exactly the <script> elements it should and is well formed (every element closed, in
order), that the CSV files read back with the csv module, and that the Chrome trace is JSON with its events.
Where a Chromium is installed, it also loads the page headless: the page's script runs without an error,
builds the kernel block of the case a link opens, and Chart.js draws the operator's chart. One line per
check; on failure, one line saying why and a non-zero exit.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser

EVIL_KERNEL = "evil</script><script>alert('x')</script>&\"<!--<script>"
COMMA_CASE = 'attn, "windowed" 7x7 | mask'
CASES, KERNELS = 4, 24
CASE_NAMES = 2  # the cases' distinct names: a row each in the HTML
CASE_COLUMNS = ["run_id", "name", "op", "shape", "dtype", "variant", "samples", "median_us", "q1_us", "q3_us",
                "min_us", "max_us", "speedup", "bytes", "bandwidth_GBps", "bandwidth_percent", "flops", "tflops",
                "peak_memory_mib", "items_per_second"]
KERNEL_COLUMNS = ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                  "StdDev (ns)", "Name"]

# Elements a browser loads something for, and the attributes that name what it loads.
FETCHING_TAGS = {"script", "link", "img", "iframe", "frame", "source", "audio", "video", "object", "embed", "track",
                 "input", "image", "use"}
URL_ATTRIBUTES = {"src", "href", "srcset", "data", "poster", "background", "xlink:href", "codebase", "archive",
                  "manifest", "action", "formaction", "ping"}
CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")]*)", re.IGNORECASE)


class Failure(Exception):
    pass


def check(condition, what, found=None):
    if not condition:
        raise Failure(what if found is None else f"{what}; found {found}")
    print(f"ok: {what}")


def css_fetches(css):
    """The URLs a stylesheet or style attribute would load (data: URLs load nothing)."""
    urls = [u for u in CSS_URL.findall(css) if not u.strip().lower().startswith("data:")]
    if re.search(r"@import", css, re.IGNORECASE):
        urls.append("@import")
    return urls


# Elements that have no end tag, and those whose end tag HTML lets a writer leave out (this writer doesn't).
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Structure(HTMLParser):
    """Checks that every element is closed, in order: the HTML parses to the tree its writer meant."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open = []
        self.errors = []
        self.ids = []

    def handle_starttag(self, tag, attrs):
        if "id" in dict(attrs):
            self.ids.append(dict(attrs)["id"])
        if tag not in VOID_TAGS:
            self.open.append((tag, self.getpos()))

    def handle_startendtag(self, tag, attrs):
        if tag not in VOID_TAGS:
            self.errors.append(f"<{tag}/> at {self.getpos()}")

    def handle_endtag(self, tag):
        if not self.open or self.open[-1][0] != tag:
            self.errors.append(f"</{tag}> at {self.getpos()} closes {self.open[-1] if self.open else 'nothing'}")
            return
        self.open.pop()


class Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fetches = []  # (tag, what it would load)
        self.scripts = []  # (attributes, text)
        self.cells = []  # text of every <td>
        self._open = None  # the element whose text is being collected: "script", "style" or "td"
        self._attrs = {}
        self._text = []

    def handle_starttag(self, tag, attrs):
        attrs = {name.lower(): value or "" for name, value in attrs}
        for name, value in attrs.items():
            remote = re.match(r"\s*(https?:|ftp:|wss?:|//)", value, re.IGNORECASE)
            if name in URL_ATTRIBUTES and (remote or (tag in FETCHING_TAGS and value.strip()
                                                      and not value.strip().lower().startswith("data:"))):
                self.fetches.append((tag, f"{name}={value}"))
            if name == "style":
                self.fetches += [(tag, u) for u in css_fetches(value)]
        if tag == "link":
            self.fetches.append((tag, str(attrs)))
        if tag == "meta" and attrs.get("http-equiv", "").lower() == "refresh":
            self.fetches.append((tag, "refresh"))
        if tag in ("script", "style", "td"):
            self._open, self._attrs, self._text = tag, attrs, []

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag in ("script", "style", "td"):
            self.handle_endtag(tag)

    def handle_data(self, data):
        if self._open:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag != self._open:
            return
        text = "".join(self._text)
        if tag == "script":
            self.scripts.append((self._attrs, text))
        elif tag == "style":
            self.fetches += [("style", u) for u in css_fetches(text)]
        else:
            self.cells.append(text)
        self._open = None


def check_html(path):
    with open(path, encoding="utf-8") as f:
        html = f.read()
    page = Page()
    page.feed(html)
    page.close()
    check(not page.fetches, "report.html fetches nothing", page.fetches[:3])
    kinds = [(a.get("type", ""), a.get("id", "")) for a, _ in page.scripts]
    check(kinds == [("application/json", "fusekit-data"), ("", ""), ("", "")],
          "report.html has exactly the data, Chart.js and page <script> elements", kinds)
    structure = Structure()
    structure.feed(html)
    structure.close()
    check(not structure.errors and not structure.open, "report.html is well formed: every element closed, in order",
          (structure.errors + [f"<{t}> at {p} left open" for t, p in structure.open])[:3])
    check(len(structure.ids) == len(set(structure.ids)), "its ids are unique")
    data = json.loads(page.scripts[0][1])
    check(len(data["cases"]) == CASE_NAMES and EVIL_KERNEL in [k["name"] for k in data["names"]],
          "the page's data is JSON and carries the kernel names unchanged")
    chartjs = page.scripts[1][1]
    check(len(chartjs) > 100_000 and "Chart.js v3.9.1" in chartjs, "Chart.js 3.9.1 is inlined")
    check("new Chart(" in page.scripts[2][1], "the page's script draws the charts")
    check(EVIL_KERNEL in page.cells and COMMA_CASE in page.cells,
          "table cells read back as the exact names (HTML escaping round-trips)")
    check_in_browser(path)


def check_in_browser(path):
    """Loads the page in headless Chromium, where one is installed, opened at the first case's kernel block."""
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        print("skipped: the page in a browser (no Chromium installed)")
        return
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom",
                                 "file://" + os.path.abspath(path) + "#case-0"],
                                capture_output=True, text=True, timeout=120)
    check(result.returncode == 0 and "</html>" in result.stdout, "Chromium loads report.html",
          result.stderr.strip()[-300:])
    errors = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    check(not errors, "its script runs without an error", errors[:2])
    check(result.stdout.count('class="kbar-row"') == 2, "the linked case's block has a bar per traced variant",
          result.stdout.count('class="kbar-row"'))
    check(re.search(r'<canvas id="speedup-0"[^>]*style="[^"]*height', result.stdout) is not None,
          "Chart.js drew the operator's speedup chart")


def check_csv(path, columns, rows):
    with open(path, newline="", encoding="utf-8") as f:
        table = list(csv.reader(f, strict=True))
    name = os.path.basename(path)
    check(table and table[0] == columns, f"{name} has the columns {columns[0]} ... {columns[-1]}")
    check(len(table) == 1 + rows, f"{name} has {rows} rows", len(table) - 1)
    check(all(len(row) == len(columns) for row in table), f"every row of {name} has {len(columns)} cells")
    return table


def check_trace(path):
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    events = trace.get("traceEvents")
    check(isinstance(events, list) and events, "trace.json has traceEvents")
    complete = [e for e in events if e.get("ph") == "X"]
    check(all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in complete), "complete events have ts and dur")
    check(min(e["ts"] for e in complete) == 0, "times start at 0, the earliest record")
    by_category = {}
    for e in complete:
        by_category[e["cat"]] = by_category.get(e["cat"], 0) + 1
    expected = {"kernel": 4, "cuda_api": 4, "memcpy": 1, "memset": 1, "nvtx": 2}
    check(by_category == expected, f"one complete event per record: {expected}", by_category)
    names = {e["args"]["name"] for e in events if e.get("ph") == "M"}
    check({"GPU 0", "Stream 7", "Stream 8", "4242", "Thread 100"} <= names, "streams and threads are named")


def main():
    if len(sys.argv) != 2:
        print("usage: check_writers.py <path to writers_dump>", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as out:
        try:
            result = subprocess.run([sys.argv[1], out], capture_output=True, text=True, timeout=60)
            check(result.returncode == 0, "writers_dump ran", f"exit {result.returncode}: {result.stderr.strip()}")
            check_html(os.path.join(out, "report.html"))
            cases = check_csv(os.path.join(out, "cases.csv"), CASE_COLUMNS, CASES)
            check(COMMA_CASE in [row[1] for row in cases], "a case name with commas and quotes reads back")
            kernels = check_csv(os.path.join(out, "kernels.csv"), KERNEL_COLUMNS, KERNELS)
            check(EVIL_KERNEL in [row[-1] for row in kernels], "kernel names read back")
            check_trace(os.path.join(out, "trace.json"))
        except (Failure, OSError, ValueError, KeyError, IndexError, csv.Error, subprocess.SubprocessError) as e:
            print(f"FAIL: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
