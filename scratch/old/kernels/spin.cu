// Keeps the GPU busy for `cycles` clock cycles (one thread of one block). The autotuner
// (cupyconv/tuning.py) queues it before each timed run, so that the run's CUDA events time the GPU's
// work and not the host's enqueueing of it (as torch.cuda._sleep does for cupyconv.bench).
namespace cupyconv {

__global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

}  // namespace cupyconv
