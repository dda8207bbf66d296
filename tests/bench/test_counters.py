"""The op / host-read counter counts what would launch a kernel or synchronise a GPU, and nothing else."""

import torch

from spectr_repro.bench.counters import count_ops


def test_arithmetic_counts_ops_and_no_host_reads():
    x = torch.rand(8)
    with count_ops() as counts:
        y = (x * 2 + 1).softmax(-1)
        y.cumsum(0)
    assert counts.ops == 4  # mul, add, softmax, cumsum
    assert counts.host_reads == 0


def test_views_and_metadata_launch_nothing():
    x = torch.rand(4, 6)
    with count_ops() as counts:
        x[1].unsqueeze(0).expand(3, -1)
        x.view(-1)
        x.t().detach()
    assert counts.ops == 0
    assert counts.host_reads == 0


def test_every_kind_of_host_read_is_counted():
    x = torch.rand(6)
    reads = [
        lambda: x[0].item(),
        lambda: float(x[0]),
        lambda: int(x.argmax()),
        lambda: bool((x > 0.5).any()),
        lambda: x.tolist(),
        lambda: x.numpy(),
        lambda: x.nonzero(),
        lambda: x[x > 0.5],
        lambda: torch.equal(x, x),
        lambda: x.cpu(),
        lambda: x.to("cpu"),
        lambda: torch.repeat_interleave(torch.tensor([1, 2])),
    ]
    for read in reads:
        with count_ops() as counts:
            read()
        assert counts.host_reads == 1, (read, dict(counts.reads_by_kind))


def test_moves_to_a_device_object_are_not_reads():
    """On a CPU run every device is the host: ``t.to(t.device)`` must not count as a synchronisation."""
    x = torch.rand(3)
    with count_ops() as counts:
        x.to(x.device)
        torch.repeat_interleave(torch.tensor([0, 1]), torch.tensor([1, 2]), output_size=3)
        x.repeat_interleave(3)  # an integer count: the output size is known (expand + copy on every device)
    assert counts.host_reads == 0


def test_counts_add_up():
    x = torch.rand(5)
    with count_ops() as first:
        x.sum().item()
    with count_ops() as second:
        x.tolist()
    total = first + second
    assert total.as_dict() == {"ops": first.ops + second.ops, "host_reads": 2}


def test_scalar_reads_are_counted_once_in_inference_mode_too():
    """The engine runs under inference_mode, where ``item``/``int``/``float``/``bool`` skip the Python
    dispatcher: they are counted at the function level, and never twice outside inference mode."""
    reads = [
        lambda x: x[0].item(),
        lambda x: float(x[0]),
        lambda x: int(x.argmax()),
        lambda x: int(x.argmax().reshape(1)),
        lambda x: bool((x > 0.5).any()),
        lambda x: [0] * 6 and list(range(6))[x.argmax()],  # __index__
    ]
    for inference in (False, True):
        with torch.inference_mode(inference):
            x = torch.rand(6)
            for read in reads:
                with count_ops() as counts:
                    read(x)
                assert counts.host_reads == 1, (inference, dict(counts.reads_by_kind))
