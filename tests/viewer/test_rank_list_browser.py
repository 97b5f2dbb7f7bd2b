"""A big job's rank list in real headless Chromium: the outlier ranks named first, with
why, and not a row per rank (bench/long.py found a 1,024-rank job listed as 1,024 rows in
a folded list that named none of its outliers); the rest found with the search box."""

from __future__ import annotations

import numpy as np

from tests.viewer.test_browser import browser, open_page, wait_for  # noqa: F401

RANKS = 48  # more than the page's RANK_ROWS (32)
STEPS = 300
SLOW_RANK, SLOW_FROM = 29, 150
ROW = "tr[data-ranks-of='job']"
SHOWN = f"""() => [...document.querySelectorAll("{ROW} li.rank")]
  .filter((e) => e.checkVisibility()).map((e) => Number(e.dataset.rank))"""


def test_a_big_jobs_rank_list_names_its_outlier_first_and_finds_the_rest(
    browser,  # noqa: F811
    serve,
    tmp_path,
):
    from tests.support.synth import write_ranked_run

    rng = np.random.default_rng(3)
    columns = {}
    for rank in range(RANKS):
        s = np.arange(STEPS)
        slow = (rank == SLOW_RANK) & (s >= SLOW_FROM)
        columns[rank] = {
            "train/loss": 2.0 * np.exp(-s / 100) + 0.3 + 0.02 * rng.standard_normal(STEPS),
            "train/step_time": np.where(slow, 0.5, 0.1) + 0.002 * rng.standard_normal(STEPS),
        }
    write_ranked_run(tmp_path / "job", columns)
    server, _ = serve(tmp_path)
    page, problems = open_page(browser)
    page.goto(server.url)

    # the straggler is named first, outside the folded list, with the reason
    first = f"() => ({SHOWN})()[0]"
    wait_for(page, f"(k) => ({first})() === k", SLOW_RANK, timeout=30_000)
    notable = page.locator(f"{ROW} .rank-notable li.rank").first
    assert notable.get_attribute("data-rank") == str(SLOW_RANK)
    assert "train/step_time" in notable.inner_text() or "straggler" in notable.inner_text()
    assert f"{RANKS} ranks" in page.locator(f"{ROW} summary").inner_text()
    assert page.evaluate(SHOWN) == [SLOW_RANK]  # folded: the rest are not drawn

    # unfolded, the list draws at most 32 rows, not one per rank, and says there are more
    page.locator(f"{ROW} summary").click()
    shown = page.evaluate(SHOWN)
    assert len(shown) <= 32 + len(page.locator(f"{ROW} .rank-notable li.rank").all())
    assert len(page.locator(f"{ROW} li.rank").all()) < RANKS
    assert "more" in page.locator(f"{ROW} .rank-all li.rank-more").inner_text()

    # the search box finds any rank
    page.locator(f"{ROW} input.rank-search").fill("rank 47")
    wait_for(page, f'() => document.querySelectorAll("{ROW} .rank-all li.rank").length === 1')
    found = page.locator(f"{ROW} .rank-all li.rank")
    assert found.get_attribute("data-rank") == "47" and f"step {STEPS - 1}" in found.inner_text()
    assert problems == []
