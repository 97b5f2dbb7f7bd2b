"""The guide's benchmark figures are ``make bench``'s results file, block for block.

``bench/all.py`` runs every bench and writes ``bench/results.json``; ``--update-docs``
pastes each bench's output into its block in the user guide (``docs/guide/benchmarks.md``,
and ``alerts.md`` beside the rules two benches measure). A figure edited by hand, a bench
re-run without updating the guide (or the reverse), a bench added without a block, or
smoke-size results committed as the real ones: each fails here.
"""

import json

from bench.all import BENCHES, PAGES, RESULTS, block, page_block


def test_results_file_is_a_full_run_of_every_bench():
    results = json.loads(RESULTS.read_text())
    assert results["smoke"] is False, "bench/results.json holds smoke-size results"
    assert set(results["benches"]) == {b.name for b in BENCHES}
    for name, record in results["benches"].items():
        assert record["output"].strip(), f"{name} printed nothing"


def test_guide_blocks_are_the_results_file():
    results = json.loads(RESULTS.read_text())
    texts = {page.name: page.read_text() for page in PAGES}
    for name, record in results["benches"].items():
        found = {page: block(name).search(text) for page, text in texts.items()}
        found = {page: match for page, match in found.items() if match}
        assert len(found) == 1, f"<!-- bench:{name} --> is in {sorted(found)} of {sorted(texts)}"
        ((page, match),) = found.items()
        assert match.group(2) == page_block(record), (
            f"{page}'s {name} block differs from bench/results.json: "
            "run `python bench/all.py --update-docs` (or re-run the bench)"
        )
