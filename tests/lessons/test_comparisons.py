"""Two models compared as a statistician would: McNemar's exact test on the images where they disagree.

Notebook 04 teaches it (``mcnemar_p``, ``disagreements``, ``clearly_better``, ``paired_test``); 05 chooses
with it, 06 calls a model a winner with it, and the champion rule (06, 07) and the roll's rule (08) use it.
The committed outputs of 05 and 06 are read back here: each conclusion they print must follow from the
numbers they print beside it.
"""

import json
import re
import uuid

import numpy as np
import pytest

from helpers import training
from workshop import runner


def paired(both: int, only_new: int, only_old: int, neither: int, seed: int = 0):
    """Labels and two models' predictions whose table of right and wrong answers is the one given."""
    rng = np.random.default_rng(seed)
    cells = np.repeat([0, 1, 2, 3], [both, only_new, only_old, neither])
    rng.shuffle(cells)
    labels = np.arange(len(cells)) % 10
    wrong = (labels + 1) % 10
    new = np.where((cells == 0) | (cells == 1), labels, wrong)
    old = np.where((cells == 0) | (cells == 2), labels, wrong)
    return labels, new, old


def intervals_overlap(new: float, old: float, n: int) -> bool:
    """The rule this test module replaces: two 95% Wilson intervals that overlap were called a tie."""
    return training.accuracy_interval(new, n)[0] <= training.accuracy_interval(old, n)[1]


def test_mcnemar_s_exact_test_against_tables_worked_by_hand():
    # b = 10, c = 2: twice the chance of 2 heads or fewer in 12 fair tosses, (1 + 12 + 66) / 4096
    assert training.mcnemar_p(10, 2) == pytest.approx(2 * 79 / 4096)
    assert training.mcnemar_p(2, 10) == training.mcnemar_p(10, 2)  # two-sided: the order does not matter
    assert training.mcnemar_p(6, 0) == pytest.approx(2 / 64)  # six to none: p = 0.031, beyond noise at 5%
    assert training.mcnemar_p(5, 0) == pytest.approx(2 / 32)  # five to none: p = 0.0625, not enough
    assert training.mcnemar_p(0, 0) == 1.0 and training.mcnemar_p(7, 7) == 1.0  # no disagreement, an even split
    # 29 more right answers: beyond noise at 5% while the two disagree on at most about 200 images
    assert training.mcnemar_p(116, 87) < 0.05 < training.mcnemar_p(117, 88)


def test_disagreements_are_the_two_off_diagonal_cells_of_the_table():
    labels, new, old = paired(both=815, only_new=35, only_old=5, neither=145)
    assert training.disagreements(new, old, labels) == (35, 5)
    assert training.disagreements(old, new, labels) == (5, 35)
    assert (training.accuracy(new, labels), training.accuracy(old, labels)) == (0.85, 0.82)
    assert training.disagreements(new, new, labels) == (0, 0)


def test_a_win_is_the_paired_test_s_where_overlapping_intervals_say_nothing():
    # notebook 04's two pairs: each 85.0% against 82.0% on the same 1,000 images, intervals overlapping
    labels, new, old = paired(both=815, only_new=35, only_old=5, neither=145)
    assert intervals_overlap(0.85, 0.82, 1000), "the old rule called this a tie"
    assert training.clearly_better(new, old, labels) and not training.clearly_better(old, new, labels)
    assert training.paired_test(new, old, labels) == (
        "right on 35 images the other gets wrong, wrong on 5 it gets right (40 disagreements in 1,000 images): "
        "McNemar's exact p = 1.4e-06, better beyond noise")
    assert training.paired_test(old, new, labels).endswith("worse beyond noise")
    labels, new, old = paired(both=685, only_new=165, only_old=135, neither=15)  # 300 disagreements
    assert (training.accuracy(new, labels), training.accuracy(old, labels)) == (0.85, 0.82)
    assert not training.clearly_better(new, old, labels) and not training.clearly_better(old, new, labels)
    assert training.paired_test(new, old, labels).endswith("McNemar's exact p = 0.094, a tie")
    assert not training.clearly_better(new, new, labels), "a model against itself is a tie"


def test_the_chart_of_compared_accuracies_draws_their_intervals():
    from matplotlib.container import ErrorbarContainer

    from helpers import plots

    figure = plots.bar_chart({"a": 0.8, "b": 0.7}, "t", "accuracy", errors={"a": (0.77, 0.82), "b": (0.67, 0.73)})
    (bars,) = [c for c in figure.axes[0].containers if isinstance(c, ErrorbarContainer)]
    low, high = bars.lines[2][0].get_segments()[0][:, 1]  # the first bar's vertical line
    assert (round(low, 2), round(high, 2)) == (0.77, 0.82)


# -- The champion rule (06, and 07 where 06 did not run) and the rule before a roll (08), on real MLflow models

SIDE = 784  # one image per pixel: image i lights pixel i, so a one-layer network can answer anything per image


def one_hot_images() -> np.ndarray:
    return np.eye(SIDE, dtype=np.float32).reshape(SIDE, 1, 28, 28)


def answering(predictions: np.ndarray):
    """Notebook 04's MLP with no hidden layer whose weights answer ``predictions[i]`` for image ``i``."""
    import torch

    net = training.build_model("mlp", [])
    with torch.no_grad():
        net.net[1].weight.zero_()
        net.net[1].bias.zero_()
        net.net[1].weight[torch.as_tensor(predictions), torch.arange(SIDE)] = 10.0
    return net.eval()


@pytest.fixture(scope="module")
def overlapping_pair(settings):
    """Two registered versions of one model, 86.0% against 82.4% on 784 validation images: the intervals
    overlap, and they disagree on 40 images, 34 to 6."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers import serving_support
    from helpers.champion_candidates import ModelChoice

    labels, better, worse = paired(both=640, only_new=34, only_old=6, neither=104, seed=1)
    images = one_hot_images()
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    client, name = MlflowClient(settings.mlflow_tracking_uri), f"t-paired-{uuid.uuid4().hex[:8]}"
    versions = {}
    with mlflow.start_run(experiment_id=client.create_experiment(name)):
        for key, predictions in (("worse", worse), ("better", better)):
            uri = training.log_torch_model(answering(predictions), images[:5], name=key).model_uri
            versions[key] = serving_support.register_as(client, name, ModelChoice(uri, f"the {key} model")).version
    return client, name, versions, images, labels


def test_the_champion_moves_to_a_model_the_paired_test_finds_better_though_the_intervals_overlap(overlapping_pair):
    from helpers import lakefs_experiments

    client, name, versions, images, labels = overlapping_pair
    new, old = 674 / SIDE, 646 / SIDE
    assert intervals_overlap(new, old, SIDE), "the old rule would have kept the champion: a tie"
    client.set_registered_model_alias(name, "champion", versions["worse"])
    better = client.get_model_version(name, versions["better"])
    accuracy_new, accuracy_old, moved, said = lakefs_experiments.champion_if_better(client, better, images, labels,
                                                                                    name)
    assert (accuracy_new, accuracy_old) == (pytest.approx(new), pytest.approx(old))
    assert moved and said.startswith("right on 34 images the other gets wrong, wrong on 6 it gets right")
    assert said.endswith("better beyond noise")
    assert client.get_model_version_by_alias(name, "champion").version == versions["better"]
    # and back: the worse model never takes the alias from the better one
    worse = client.get_model_version(name, versions["worse"])
    assert lakefs_experiments.champion_if_better(client, worse, images, labels, name)[2] is False
    assert client.get_model_version_by_alias(name, "champion").version == versions["better"]


def test_the_roll_s_rule_refuses_a_challenger_worse_beyond_noise_and_lets_a_tie_through(overlapping_pair):
    from helpers.serving import may_roll

    client, name, versions, images, labels = overlapping_pair
    allowed, said = may_roll(name, versions["better"], versions["worse"], images, labels)
    assert not allowed and said.endswith("worse beyond noise; the roll to it is refused"), said
    allowed, said = may_roll(name, versions["worse"], versions["better"], images, labels)
    assert allowed and said.endswith("better beyond noise; it may take a canary's share"), said
    allowed, said = may_roll(name, versions["better"], versions["better"], images, labels)  # the same weights
    assert allowed and "(0 disagreements in 784 images)" in said and "a tie" in said


# -- The committed outputs of 05 and 06: each conclusion follows from the numbers printed beside it

PAIRED = re.compile(r"right on (\d+) images the other gets wrong, wrong on (\d+) it gets right \(([\d,]+) "
                    r"disagreements in ([\d,]+) images\): McNemar's exact p = (\S+), (better beyond noise|worse "
                    r"beyond noise|a tie)")


def committed(number: str) -> tuple[str, dict]:
    """A committed notebook's printed text (every stream output) and its summary's facts."""
    (notebook,) = runner.notebook_paths(pattern=f"{number}_*.ipynb")
    cells = json.loads(notebook.read_text())["cells"]
    printed = "".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
                      for o in c.get("outputs", []) if o.get("output_type") == "stream")
    summary = next(o["data"]["application/json"] for c in cells if "summary" in c["metadata"].get("tags", [])
                   for o in c["outputs"] if "application/json" in o.get("data", {}))
    return printed, summary


def checked(match: re.Match) -> tuple[int, int, int, str]:
    """The numbers of one printed paired test, checked against McNemar's test; ``(b, c, images, verdict)``."""
    b, c, total, images, p, verdict = match.groups()
    b, c, total, images = int(b), int(c), int(total.replace(",", "")), int(images.replace(",", ""))
    assert total == b + c and p == f"{training.mcnemar_p(b, c):.2g}", match.group(0)
    expected = ("better beyond noise" if b > c and training.mcnemar_p(b, c) < 0.05 else
                "worse beyond noise" if c > b and training.mcnemar_p(b, c) < 0.05 else "a tie")
    assert verdict == expected, match.group(0)
    return b, c, images, verdict


def test_05_s_committed_choice_follows_the_paired_test():
    printed, facts = committed("05")
    line = next(line for line in printed.splitlines() if line.startswith("the sweep's best against the starting"))
    b, c, images, verdict = checked(PAIRED.search(line))
    assert images == 1000
    # the accuracies printed beside it differ by what the disagreements say
    assert facts["sweep's best val_accuracy"] - facts["known-good val_accuracy"] == pytest.approx((b - c) / images)
    better = verdict == "better beyond noise"
    assert facts["clearly better than the known-good point"] is better
    assert facts["sweep's best against the known-good point"] == line.split("starting point: ", 1)[1]
    chosen = next(line for line in printed.splitlines() if line.startswith("chosen:"))
    assert chosen.endswith("(the sweep's best: better beyond noise)" if better else
                           "(the starting point: a tie keeps it)")
    expected = facts["sweep's best val_accuracy"] if better else facts["known-good val_accuracy"]
    assert facts["chosen val_accuracy"] == expected
    if not better:
        assert facts["chosen is the known-good point"] is True


def test_06_s_committed_winner_or_chosen_follows_the_paired_test():
    printed, facts = committed("06")
    chosen = facts["chosen"]
    accuracies = {m.group(1): float(m.group(2)) / 100 for m in
                  re.finditer(r"^(exp-\S+)\s+commit \S+\s+validation accuracy ([\d.]+)%", printed, re.M)}
    assert len(accuracies) == facts["experiments"] and max(accuracies, key=accuracies.get) == chosen
    verdicts = {}
    for match in re.finditer(rf"^{re.escape(chosen)} against (exp-\S+): (.*)$", printed, re.M):
        b, c, images, verdict = checked(PAIRED.search(match.group(2)))
        assert images == facts["validation images"]
        assert accuracies[chosen] - accuracies[match.group(1)] == pytest.approx((b - c) / images, abs=1e-9)
        verdicts[match.group(1)] = verdict
    assert set(verdicts) == set(accuracies) - {chosen}, "the chosen one against every other experiment"
    assert facts["chosen against the others"] == verdicts
    winner = all(verdict == "better beyond noise" for verdict in verdicts.values())
    assert facts["chosen is the winner"] is winner
    said = next(line for line in printed.splitlines() if line.startswith(f"{chosen}: the winner")
                or line.startswith(f"{chosen}: chosen as the best on validation"))
    assert said.startswith(f"{chosen}: the winner") is winner
    if not winner:
        assert "winner" not in printed.replace("the winner, better beyond noise", ""), "a winner only beyond noise"
    # the champion rule's lines follow the same test
    for line in printed.splitlines():
        if " against the champion: " in line or "against the champion before it: " in line:
            match = PAIRED.search(line)
            if match:
                checked(match)
