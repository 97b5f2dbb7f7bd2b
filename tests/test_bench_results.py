"""The README's benchmark figures are ``make bench``'s results file, block for block.

``bench/all.py`` runs every bench and writes ``bench/results.json``; ``--update-readme``
pastes each bench's output into its README block. A figure edited by hand, a bench
re-run without updating the README (or the reverse), a bench added without a block, or
smoke-size results committed as the real ones: each fails here.
"""

import json

from bench.all import BENCHES, README, RESULTS, block, readme_block


def test_results_file_is_a_full_run_of_every_bench():
    results = json.loads(RESULTS.read_text())
    assert results["smoke"] is False, "bench/results.json holds smoke-size results"
    assert set(results["benches"]) == {b.name for b in BENCHES}
    for name, record in results["benches"].items():
        assert record["output"].strip(), f"{name} printed nothing"


def test_readme_blocks_are_the_results_file():
    results = json.loads(RESULTS.read_text())
    text = README.read_text()
    for name, record in results["benches"].items():
        found = block(name).search(text)
        assert found, f"README.md has no <!-- bench:{name} --> block"
        assert found.group(2) == readme_block(record), (
            f"README's {name} block differs from bench/results.json: "
            "run `python bench/all.py --update-readme` (or re-run the bench)"
        )
