"""The training callbacks on their own: the time budget's stopping rule, the progress
line's figures."""

import time

import keras
import pytest

from keras_transformer.training.callbacks import (CheckpointAndBleu, EarlyStopping, Progress, TimeBudget,
                                                  rounds_without_improvement)


def _stand_in_model():
    """What `Progress` reads of a model: `optimizer.iterations`, a variable at step 0."""
    import tensorflow as tf

    return type("M", (), {"optimizer": type("O", (), {"iterations": tf.Variable(0, dtype=tf.int64)})()})()


def _rounds(monkeypatch, seconds, first_step, rounds, steps_per_round):
    """A TimeBudget of `seconds` (clock started at 0) fed `rounds` of (begin, end) times, each
    `steps_per_round` steps from `first_step`; yields the budget after each round."""
    class Model:
        stop_training = False
        optimizer = type("Optimizer", (), {"iterations": keras.Variable(first_step)})()

    clock = [0.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    budget = TimeBudget(seconds, started=0.0)
    budget.set_model(Model())
    for begin, end in rounds:
        clock[0] = begin
        budget.on_epoch_begin(0)
        budget.model.optimizer.iterations.assign_add(steps_per_round)
        clock[0] = end
        budget.on_epoch_end(0)
        yield budget


def test_time_budget_stops_when_the_next_round_would_end_past_it(monkeypatch, capsys):
    rounds = [(10, 40), (40, 70), (70, 71), (71, 86)]
    for (_, end), stops, budget in zip(rounds, [False, False, False, True], _rounds(monkeypatch, 100, 0, rounds, 25)):
        # round 2 ends at 70 and took 30: 100, not past; round 4 ends at 86 + 15 > 100
        assert (budget.exhausted, budget.model.stop_training) == (stops, stops)
        if end == 70:
            # After the second round: 30 s a round, 30 s left, one more round: step 50 + 25.
            assert budget.projected_step == 75
    out = capsys.readouterr().out
    assert "0.50 min per round of 25 steps, so the 1.66667 min budget reaches about step 75 (" in out
    assert out.count("reaches about step") == 1


def test_time_budget_projects_from_this_process_s_second_round(monkeypatch):
    """A resumed run: its rounds start at step 1,000; the projection counts from there, and the
    budget's clock started before the first round (loading, tracing)."""
    *_, budget = _rounds(monkeypatch, 600, 1000, [(20, 120), (120, 170)], 250)
    # 50 s a round, 430 s left: 8 more rounds after step 1,500.
    assert budget.projected_step == 1500 + 8 * 250 and not budget.exhausted


def test_progress_figures(monkeypatch):
    import io

    # begin, epoch, then per batch: the rate's reading and the ETA's reading.
    clock = iter([100.0, 100.0, 101.0, 101.0, 103.0, 103.0, 105.0, 105.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    progress = Progress(total_steps=10, live=True, stream=stream)
    progress.set_model(_stand_in_model())
    iterations = progress.model.optimizer.iterations
    progress.on_train_begin()  # t=100, step 0
    progress.on_epoch_begin(0)  # t=100
    for batch, (tokens, step) in enumerate([(500.0, 1), (1500.0, 2), (2500.0, 3)]):
        iterations.assign(step)
        progress.on_train_batch_end(batch, {"loss": 2.5, "target_tokens": tokens})
    # Batch 0 (tracing) is not timed; then 1000 tokens in 2 s, twice.
    assert progress.tokens_per_second == pytest.approx(500.0)
    text = stream.getvalue()
    assert text.startswith("\rstep 1/10 [==")
    last = text.rsplit("\r", 1)[1]
    # 3 steps in 5 s (t=100 -> 105), 7 steps to go -> ETA 11.7 s.
    assert last.startswith("step 3/10 [=======                 ]  loss 2.5000  500 tok/s  ETA 0:11")


def test_the_rate_is_the_current_rounds_after_a_paused_round(monkeypatch):
    """tok/s counts the current round (its first step, with tracing, aside): a round in which
    the process was paused for 600 s (Ctrl-Z, SIGSTOP) reads slow, the next round reads its
    own 500 tok/s again (an average over the run read 1000 tokens in ~602 s)."""
    import io

    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    progress = Progress(total_steps=10, live=False, stream=io.StringIO())
    progress.set_model(_stand_in_model())
    iterations = progress.model.optimizer.iterations
    progress.on_train_begin()
    step = 0
    for pause in (600.0, 0.0):  # two rounds of 3 steps, 500 tokens each, 1 s a step
        progress.on_epoch_begin(0)
        for batch in range(3):
            now[0] += 1.0 + (pause if batch == 1 else 0.0)
            step += 1
            iterations.assign(step)
            progress.on_train_batch_end(batch, {"loss": 2.0, "target_tokens": 500.0 * (batch + 1)})
        if pause:
            assert progress.tokens_per_second == pytest.approx(1000.0 / 602.0)
    assert progress.tokens_per_second == pytest.approx(500.0)


def test_the_eta_is_the_time_budgets_when_it_ends_the_run_first(monkeypatch):
    """The Multi30k preset trains for 56 minutes, capped at 40,000 steps: the ETA said
    '5:58:26' at step 3,000 of a run that stopped 45 minutes later. With a budget the ETA
    is the sooner of the steps' and the budget's."""
    clock = iter([100.0, 105.0, 105.0, 110.0])  # perf_counter: begin, then two readings
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(time, "time", lambda: 1_000.0 + 20.0)  # 20 s into the budget
    model = _stand_in_model()
    budgeted = Progress(total_steps=40_000, live=False, budget_seconds=60.0, started=1_000.0)
    plain = Progress(total_steps=40_000, live=False)
    for progress in (budgeted, plain):
        progress.set_model(model)
    budgeted.on_train_begin()  # t=100, step 0
    plain.on_train_begin()  # t=105
    model.optimizer.iterations.assign(5)
    assert budgeted.eta_seconds() == pytest.approx(40.0)  # 5 steps in 5 s: 39,995 s by the steps
    assert plain.eta_seconds() == pytest.approx(39_995.0)  # no budget: the steps' (5 steps in 5 s)
    model.optimizer.iterations.assign(39_998)
    monkeypatch.setattr(time, "perf_counter", lambda: 110.0)
    assert budgeted.eta_seconds() == pytest.approx(2 * 10 / 39_998)  # the steps end first
    monkeypatch.setattr(time, "time", lambda: 1_000.0 + 75.0)  # past the budget: the last round
    assert budgeted.eta_seconds() == 0.0


def test_the_checkpoint_line_counts_the_valid_sentences_it_scored(tmp_path, capsys):
    """`--bleu-every-sentences 100` on a valid split of 3 sentences scored 3, and the line
    said 'greedy BLEU on 100 valid sentences'. The count is the sentences translated."""
    import tensorflow as tf

    class Store:
        def save(self, step):
            return str(tmp_path / f"ckpt-{step}")

    class Copier:  # translates each source to its reference: BLEU 100
        def translate(self, sources, beam_size):
            assert beam_size == 1
            known = {"ein rotes Haus heute": "a red house today"}
            return [known.get(s, s) for s in (x.decode() for x in sources.numpy())]

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    pairs = tf.data.Dataset.from_tensor_slices((["the dog sees the cat", "a cat sees a bird", "ein rotes Haus heute"],
                                                ["the dog sees the cat", "a cat sees a bird", "a red house today"]))
    for limit, scored in ((100, 3), (2, 2)):
        callback = CheckpointAndBleu(Store(), Copier(), pairs, limit, tmp_path)
        callback.set_model(model)
        callback.on_epoch_end(0, {"loss": 1.0})
        assert capsys.readouterr().out == f"step 0, loss 1.0000, checkpoint ckpt-0, greedy BLEU on {scored} valid " \
                                          f"sentences 100.00\n"


def test_rounds_without_improvement_count_from_the_lowest_validation_loss():
    """`--early-stopping`'s count, from history.csv's rows as written (strings, 4 decimals):
    rounds after the lowest validation loss, a tie no improvement, rows without one skipped,
    rows past a resumed run's step left out, and of two rows of a step the later one."""
    def rows(*pairs):
        return [{"step": str(step), "val_loss": "" if loss is None else f"{loss:.4f}"} for step, loss in pairs]

    assert rounds_without_improvement([]) == (0, None)
    assert rounds_without_improvement(rows((1, None), (2, None))) == (0, None)
    assert rounds_without_improvement(rows((1, 3.0), (2, 2.5), (3, 2.6), (4, 2.55))) == (2, 2)
    assert rounds_without_improvement(rows((1, 3.0), (2, 2.5), (3, 2.5), (4, 2.50001))) == (2, 2)  # ties
    assert rounds_without_improvement(rows((2, 2.5), (4, 2.4))) == (0, 4)
    assert rounds_without_improvement(rows((1, 3.0), (2, None), (3, 2.9), (4, 3.1))) == (1, 3)
    history = rows((1, 3.0), (2, 2.5), (3, 2.6), (4, 2.7))
    assert rounds_without_improvement(history, up_to_step=3) == (1, 2)
    assert rounds_without_improvement(history + rows((3, 2.4)), up_to_step=3) == (0, 3)  # step 3 again, resumed


def test_early_stopping_counts_the_history_up_to_the_rounds_step(tmp_path, capsys):
    """The callback stops `fit` (`stop_training`) when history.csv, read up to the step the
    round ends at, has `patience` rounds without a lower validation loss: rows past that step
    (left by a part that ran on from a checkpoint which then could not be read) do not count."""
    from keras_transformer import run_dir

    class Model:
        stop_training = False
        optimizer = type("Optimizer", (), {"iterations": keras.Variable(6)})()

    for step, loss in ((2, 3.0), (4, 2.9), (6, 2.95), (8, 2.99), (10, 3.1)):  # 8 and 10: an earlier part's
        run_dir.append_history(tmp_path, {"step": step, "val_loss": f"{loss:.4f}"})
    early = EarlyStopping(2, tmp_path)
    early.set_model(Model())
    early.on_epoch_end(0)
    assert (early.stopped, early.model.stop_training, early.best_step) == (False, False, 4)  # 1 round since step 4
    run_dir.append_history(tmp_path, {"step": 8, "val_loss": "2.9100"})  # this part's round to step 8
    early.model.optimizer.iterations.assign(8)
    early.on_epoch_end(1)
    assert (early.stopped, early.model.stop_training, early.best_step) == (True, True, 4)
    assert capsys.readouterr().out == ("early stopping: the validation loss has not improved for 2 checkpoints "
                                       "(best at step 4); stopping at step 8\n")
