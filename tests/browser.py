"""A real browser for the tests: Debian's headless Chromium (``chromium-headless-shell``, which
.ci/run installs, and the real tier installs as the sandbox installs Slurm, when missing and
root) takes a screenshot of a page, and pillow reads its pixels back."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")


def browser() -> str | None:
    """The headless Chromium on PATH, if any."""
    return next((found for found in map(shutil.which, BROWSERS) if found), None)


def ensure_browser() -> str:
    """The headless Chromium, apt-installed first where it is missing (as root)."""
    found = browser()
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "chromium-headless-shell"],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-2000:]}"
        found = browser()
    assert found is not None, f"no headless browser on PATH (one of {', '.join(BROWSERS)})"
    return found


def screenshot(page: Path, png: Path, width: int, height: int) -> Path:
    """``png``: what a browser window of ``width`` x ``height`` CSS pixels shows of ``page``
    (one device pixel per CSS pixel), taken with no network."""
    found = ensure_browser()
    done = subprocess.run(
        [
            found,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--no-first-run",
            "--disable-extensions",
            "--proxy-server=127.0.0.1:9",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=png.parent,
    )
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    return png
