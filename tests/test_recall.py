"""mlexp.recall: task generators checked against brute force, seeding, accuracy, and a tiny model that learns."""
import pytest
import torch

from mlexp.recall import (IGNORE, RecallTask, accuracy_by_distance, associative_recall, evaluate_recall, mqar,
                          recall_model, recall_with_overwrites, train_recall)


def brute_force_answers(inputs, n_write_tokens, n_keys):
    """For each position after the writes holding a key: (position, latest value, distance), by scanning."""
    found = []
    for p in range(n_write_tokens, len(inputs)):
        tok = int(inputs[p])
        if tok >= n_keys:
            continue                                       # a filler (or value) token: not a query
        latest = None
        for w in range(0, n_write_tokens, 2):              # writes sit at even positions: key, then value
            if int(inputs[w]) == tok:
                latest = w
        assert latest is not None, "a query asks about a key that was never written"
        found.append((p, int(inputs[latest + 1]), p - latest))
    return found


def check_by_brute_force(batch, n_write_tokens, n_keys):
    for row in range(batch.inputs.shape[0]):
        expected = brute_force_answers(batch.inputs[row], n_write_tokens, n_keys)
        scored = (batch.targets[row] != IGNORE).nonzero().flatten().tolist()
        assert scored == [p for p, _, _ in expected]
        for p, value, dist in expected:
            assert batch.targets[row, p] == value and batch.distances[row, p] == dist
        unscored = batch.targets[row] == IGNORE
        assert (batch.distances[row][unscored] == -1).all()


def test_associative_recall_shapes_and_targets():
    g = torch.Generator().manual_seed(0)
    b = associative_recall(50, 5, n_keys=8, n_values=6, generator=g)
    assert b.inputs.shape == b.targets.shape == b.distances.shape == (50, 11)
    assert b.inputs.dtype == torch.long and b.n_pairs == 5
    keys, values = b.inputs[:, 0:10:2], b.inputs[:, 1:10:2]
    assert (keys < 8).all() and ((values >= 8) & (values < 14)).all()
    assert all(len(set(row.tolist())) == 5 for row in keys), "keys in a sequence must be distinct"
    check_by_brute_force(b, 10, 8)
    assert set(b.distances[:, -1].tolist()) <= set(range(2, 11, 2))


@pytest.mark.parametrize("n_pairs, seq_len, n_queries", [(4, None, None), (6, 30, 3), (1, 3, 1)])
def test_mqar_targets_match_brute_force(n_pairs, seq_len, n_queries):
    g = torch.Generator().manual_seed(1)
    b = mqar(40, n_pairs, n_keys=10, n_values=7, seq_len=seq_len, n_queries=n_queries, generator=g)
    T = 4 * n_pairs if seq_len is None else seq_len
    assert b.inputs.shape == (40, T)
    n_scored = (b.targets != IGNORE).sum(1)
    assert (n_scored == (n_pairs if n_queries is None else n_queries)).all()
    filler = 10 + 7
    region = b.inputs[:, 2 * n_pairs:]
    assert ((region < 10) | (region == filler)).all()
    check_by_brute_force(b, 2 * n_pairs, 10)


def test_overwrites_target_the_latest_value():
    g = torch.Generator().manual_seed(2)
    b = recall_with_overwrites(60, 3, 9, n_keys=12, n_values=20, generator=g)
    assert b.inputs.shape == (60, 2 * 9 + 2 * 3)
    check_by_brute_force(b, 18, 12)
    # Each key is written at least once, and keys really are written again.
    keys = b.inputs[:, 0:18:2]
    assert all(len(set(row.tolist())) == 3 for row in keys)
    # Somewhere the latest value differs from the first value written under the same key.
    differs = 0
    for row in range(60):
        for p in (b.targets[row] != IGNORE).nonzero().flatten().tolist():
            first = next(w for w in range(0, 18, 2) if b.inputs[row, w] == b.inputs[row, p])
            differs += int(b.inputs[row, first + 1] != b.targets[row, p])
    assert differs > 20


def test_seeding_is_reproducible_and_seeds_differ():
    for make in (lambda g: associative_recall(20, 4, generator=g), lambda g: mqar(20, 4, generator=g),
                 lambda g: recall_with_overwrites(20, 4, 8, generator=g)):
        a, b, c = (make(torch.Generator().manual_seed(s)) for s in (7, 7, 8))
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
        assert not torch.equal(a.inputs, c.inputs)


def test_bad_sizes_say_what_to_do():
    with pytest.raises(ValueError, match="distinct keys"):
        mqar(2, 10, n_keys=8)
    with pytest.raises(ValueError, match="seq_len"):
        mqar(2, 4, seq_len=8)
    with pytest.raises(ValueError, match="n_writes"):
        recall_with_overwrites(2, 4, 3)
    with pytest.raises(ValueError, match="kind"):
        RecallTask("copy", 2).sample(1)


def test_accuracy_by_distance_on_a_hand_made_case():
    targets = torch.tensor([[IGNORE, 5, IGNORE, 6], [7, IGNORE, 8, IGNORE]])
    distances = torch.tensor([[-1, 2, -1, 4], [2, -1, 4, -1]])
    predictions = torch.tensor([[0, 5, 0, 1], [1, 9, 8, 3]])
    # distance 2: (row 0 right, row 1 wrong) -> 0.5 of 2; distance 4: (wrong, right) -> 0.5 of 2
    assert accuracy_by_distance(predictions, targets, distances) == {2: (0.5, 2), 4: (0.5, 2)}
    predictions[1, 0] = 7
    assert accuracy_by_distance(predictions, targets, distances) == {2: (1.0, 2), 4: (0.5, 2)}
    with pytest.raises(ValueError, match="same shape"):
        accuracy_by_distance(predictions[:, :2], targets, distances)


@pytest.mark.slow
def test_a_tiny_attention_model_learns_four_pairs():
    torch.manual_seed(0)
    task = RecallTask("mqar", 4, n_keys=16, n_values=16)          # chance: 1/16
    model = recall_model("attention", task.vocab_size, dim=32, n_layers=2, max_len=16)
    history = train_recall(model, task, steps=250, batch_size=32, lr=3e-3, seed=0, log=False, device="cpu")
    result = evaluate_recall(model, task, n_examples=300)
    assert history["loss"][-1] < history["loss"][0]
    assert result["accuracy"] > 0.5, result
    assert set(result["by_pairs"]) == {4}
    assert sum(c for _, c in result["by_distance"].values()) == 300 * 4


@pytest.mark.parametrize("mixer", ["decay", "delta", "gated_delta"])
def test_recall_model_builds_every_named_mixer(mixer):
    model = recall_model(mixer, vocab_size=20, dim=16, n_layers=1, n_heads=2)
    logits = model(torch.randint(0, 20, (2, 12)))
    assert logits.shape == (2, 12, 20)


def test_recall_model_takes_a_mixer_factory_and_rejects_unknown_names():
    from mlexp.mixers import LinearAttention
    made = []
    model = recall_model(lambda i: made.append(i) or LinearAttention(16, 2), vocab_size=20, dim=16, n_layers=2)
    assert made == [0, 1] and model(torch.randint(0, 20, (1, 5))).shape == (1, 5, 20)
    with pytest.raises(ValueError, match="gated_delta"):
        recall_model("mamba", vocab_size=20)
