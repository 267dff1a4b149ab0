#!/usr/bin/env python3
"""Render a `lab report` page in headless Chromium and check what a reader sees.

    python3 scripts/report_browser_test.py REPORT.html [--screenshot OUT.png|.jpg] [--screenshot-height H] [--figures N]

Checks (each failure is printed; the exit status is 1 if any fails):
- the page loads with no console error, no uncaught exception and no request leaving the file
  (the page must be self-contained: every request other than the page itself is a failure);
- every inlined figure (`figure.lab-figure`) holds an <svg> that is laid out (width and height
  > 100 px) and draws something (at least 20 drawn elements: paths, lines, rects, texts...);
- at least N figures (default 1), the claim, the runs table with one row or more, and the
  provenance section are present; clicking a runs-table header sorts it.
Then it takes a full-page screenshot (PNG, or JPEG at quality 70 for a .jpg name).

Chromium is the system's (Debian: apt-get install chromium), driven through Playwright
(pip install playwright; no browser download: `executable_path` points at the system binary).
"""

import argparse
import shutil
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no Chromium found: apt-get install chromium (Debian) or put it on PATH")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--screenshot", type=Path)
    ap.add_argument("--figures", type=int, default=1, help="figures the page must hold")
    ap.add_argument("--screenshot-height", type=int,
                    help="only the top H pixels of the page (default: the whole page)")
    args = ap.parse_args()
    if not args.report.is_file():
        sys.exit(f"{args.report}: no such file (run `lab report SWEEP` first)")
    url = args.report.resolve().as_uri()
    failures, console, requests = [], [], []

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: failures.append(f"uncaught exception: {e}"))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url, wait_until="load")

        for kind, text in console:
            if kind in ("error", "warning"):
                failures.append(f"console {kind}: {text}")
        foreign = [r for r in requests if r != url and not r.startswith("data:")]
        for r in foreign:
            failures.append(f"request outside the page: {r}")

        figs = page.eval_on_selector_all(
            "figure.lab-figure",
            """els => els.map(f => {
                const svg = f.querySelector('svg');
                const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
                return {id: f.id, svg: !!svg, w: box.width, h: box.height,
                        drawn: svg ? svg.querySelectorAll('path,line,polyline,polygon,rect,circle,text').length : 0,
                        caption: (f.querySelector('figcaption') || {}).textContent || ''};
            })""",
        )
        for f in figs:
            ok = f["svg"] and f["w"] > 100 and f["h"] > 100 and f["drawn"] >= 20 and f["caption"]
            print(f"figure {f['id']}: {f['w']:.0f}×{f['h']:.0f} px, {f['drawn']} drawn elements"
                  f" — {'ok' if ok else 'EMPTY OR MISSING'}")
            if not ok:
                failures.append(f"figure {f['id']} is empty, unsized or uncaptioned: {f}")
        if len(figs) < args.figures:
            failures.append(f"{len(figs)} figure(s) in the page, expected at least {args.figures}")

        for sel, what in [(".claim", "the claim"), ("#provenance", "the provenance section"),
                          ("table.runs tbody tr", "a row of the runs table")]:
            if page.query_selector(sel) is None:
                failures.append(f"missing: {what} ({sel})")

        # Sorting: click the first header of the runs table twice; the order must reverse.
        header = page.query_selector("table.runs th")
        if header is not None:
            first = lambda: page.eval_on_selector("table.runs tbody tr td", "td => td.textContent")
            header.click()
            up = first()
            header.click()
            down = first()
            rows = page.eval_on_selector_all("table.runs tbody tr", "rs => rs.length")
            if rows > 1 and up == down:
                failures.append("clicking a runs-table header does not sort it")
            print(f"runs table: {rows} rows; sorting by the first column: {up} … then {down}")

        if args.screenshot:
            args.screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.goto(url, wait_until="load")
            jpeg = args.screenshot.suffix.lower() in (".jpg", ".jpeg")
            opts = {"type": "jpeg", "quality": 70} if jpeg else {}
            if args.screenshot_height:
                opts["clip"] = {"x": 0, "y": 0, "width": 1280, "height": args.screenshot_height}
            page.screenshot(path=str(args.screenshot), full_page=True, **opts)
            print(f"screenshot: {args.screenshot}")
        browser.close()

    print(f"{len(console)} console message(s), {len(requests)} request(s)")
    if failures:
        for f in failures:
            print(f"FAIL: {f}")
        sys.exit(1)
    print(f"report ok: {args.report} ({len(figs)} figures)")


if __name__ == "__main__":
    main()
