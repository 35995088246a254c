"""Check the built documentation site in a real headless browser: every page loads, every
image on it decodes, and no link to a page or file of the site is broken.

    python scripts/check_site.py build/site        # `make docs-check` (after `make docs`)

Serves the site on a local port, opens every HTML page in headless Chromium (Selenium with
the system's chromium and chromedriver; `.ci/run` installs them), and for each page checks
that the document finished loading, that every <img> has a decoded size, and that every
link within the site answers (200) when fetched from the server. External links are not
fetched (the machine may have no internet); they are counted. Exits 1 with one line per
problem.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if binary:
        options.binary_location = binary
    driver = shutil.which("chromedriver")
    return webdriver.Chrome(options=options, service=Service(driver) if driver else None)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def check(site: Path) -> list[str]:
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    if not pages:
        return [f"{site}: no HTML pages (run `make docs` first)"]
    server, base = serve(site)
    problems: list[str] = []
    checked: dict[str, int] = {}
    external = 0
    driver = browser()
    try:
        for page in pages:
            driver.get(urljoin(base, page))
            deadline = time.monotonic() + 15
            while driver.execute_script("return document.readyState") != "complete" and time.monotonic() < deadline:
                time.sleep(0.1)
            if driver.execute_script("return document.readyState") != "complete":
                problems.append(f"{page}: did not finish loading in 15 s")
            broken = driver.execute_script(
                "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
                ".map(i => i.getAttribute('src'))")
            problems += [f"{page}: image {src} does not decode" for src in broken]
            for href in driver.execute_script("return Array.from(document.links).map(a => a.href)"):
                url = urldefrag(href)[0]
                if urlparse(url).netloc != urlparse(base).netloc:
                    external += 1
                    continue
                if url not in checked:
                    checked[url] = status(url)
                if checked[url] != 200:
                    problems.append(f"{page}: link {url[len(base) - 1:]} answers {checked[url]}")
    finally:
        driver.quit()
        server.shutdown()
    print(f"{len(pages)} pages in a headless browser, {len(checked)} site links fetched, "
          f"{external} external links not fetched, {len(problems)} problems")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("site", nargs="?", default="build/site")
    problems = check(Path(p.parse_args().site))
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
