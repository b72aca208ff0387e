"""The options ``sitelens heads`` takes for ``--frontier`` (:mod:`sitelens.cli.frontier`), added by
the parser; apart from :mod:`sitelens.cli.frontier` so the parser imports nothing that imports it."""

from __future__ import annotations

SELECTOR_NAMES = "alpha,alpha-sparse,alpha-grad,atp,effect,greedy,sparse"


def add_frontier_options(p) -> None:
    """``--out``, ``--json`` (shared with the lenses run) and the frontier's own options."""
    p.add_argument("--out", required=True,
                   help="write the HeadScores table to this CSV; with --frontier, the directory of "
                        "frontier.csv and summary.json")
    p.add_argument("--json", action="store_true",
                   help='print {"model", "task", "lenses": {lens: {"top": [[layer, head, score], '
                        '...], "forward_passes", "backward_passes", "seconds"}}, "alpha_stability"}; '
                        "with --frontier the summary (k* and stability per selector)")
    g = p.add_argument_group("frontier: how few heads carry the task (--frontier)")
    g.add_argument("--frontier", action="store_true",
                   help="the accuracy-vs-heads frontier instead of the lens scores (no --lenses)")
    g.add_argument("--budgets", default="1,2,5,10,20,50",
                   help="comma-separated head budgets k (each at most the model's head count)")
    g.add_argument("--selectors", default=SELECTOR_NAMES, help=f"comma-separated: {SELECTOR_NAMES}")
    g.add_argument("--greedy-max-k", type=int, default=None,
                   help="greedy's largest set (default: the largest budget)")
    g.add_argument("--greedy-pool", type=int, default=None,
                   help="prune greedy's candidates to the top-P heads of alpha-grad")
    g.add_argument("--test-limit", type=int, default=None, help="the first test items only")
    g.add_argument("--no-exact-match", action="store_true",
                   help="first-token accuracy only (exact match generates under every set: slow)")
    g.add_argument("--n-bootstrap", type=int, default=0,
                   help="resamples of the selection items for the stability (each reruns every selector)")
