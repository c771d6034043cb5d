"""GPU time of launches captured in a CUDA graph, for the profile scripts that time plans as a converted
model in graph mode runs them (split_k.py, simt_plans.py): no host between launches, no interleaving."""
import torch

CALLS, REPLAYS = 20, 30


def graph_ms(enqueue) -> float:
    """Median ms per call of ``enqueue(stream)`` (CALLS per graph) over REPLAYS graph replays."""
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        enqueue(stream.cuda_stream)  # compiled and warm before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(CALLS):
                enqueue(stream.cuda_stream)
    times = []
    for _ in range(REPLAYS + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return sorted(times[3:])[REPLAYS // 2]
