"""The report in a real browser: headless Chromium (Debian's `chromium` package) opens the
page from disk with the network off and every embedded image decodes."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ensemble.results import report as R
from tests.ensemble.test_report import make_run

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROBE = """<script>window.addEventListener('load', () => { const imgs = [...document.images];
document.body.setAttribute('data-images', imgs.length);
document.body.setAttribute('data-loaded', imgs.filter(i => i.complete && i.naturalWidth > 0).length); });
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
@pytest.mark.parametrize("task, evolve", [("classification", True), ("regression", False)])
def test_the_report_renders_with_every_image_loaded(tmp_path, task, evolve):
    run = make_run(tmp_path / "run", task, evolve=evolve)
    page = R.write_report(run).read_text()
    probe = tmp_path / "probe.html"                  # the page plus a script that counts decoded images
    probe.write_text(page.replace("</body>", PROBE))
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           "--virtual-time-budget=5000", "--proxy-server=127.0.0.1:9",   # any fetch would fail
                           probe.as_uri()], capture_output=True, text=True, timeout=120)
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, proc.stderr[-2000:]
    images = int(re.search(r'data-images="(\d+)"', body.group()).group(1))
    loaded = int(re.search(r'data-loaded="(\d+)"', body.group()).group(1))
    assert images == page.count("data:image/png;base64,") >= 4 and loaded == images
