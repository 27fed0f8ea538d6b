#!/usr/bin/env python3
"""One training step of the same MLP and CNN as kernels/models, in PyTorch on the same device.

Prints "TORCH <model> <batch> <math> <compute_ms> <with_transfers_ms>" per model, batch and
math (fp32: float32 GEMMs and convolutions; tf32: TF32 tensor cores allowed for both):
  compute_ms          forward, loss, backward on device-resident parameters and batch;
  with_transfers_ms   the same plus what pscluster's TrainStep also does each step: copy the
                      parameters and the batch from host memory and the gradients back to it.
Float32 tensors throughout, cuDNN autotuning on. Prints "TORCH_UNAVAILABLE <reason>" and exits 0
where torch or a CUDA device is missing. Run it with the caller's environment: a
LD_LIBRARY_PATH pointing at other CUDA libraries can break torch's import.
"""
import statistics
import sys
import time


def main():
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # ImportError, or a broken install.
        print(f"TORCH_UNAVAILABLE torch not available ({type(e).__name__}: {e})")
        return 0
    if not torch.cuda.is_available():
        print("TORCH_UNAVAILABLE torch not available on CUDA (no device)")
        return 0
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}) on {torch.cuda.get_device_name(0)}", file=sys.stderr)

    def mlp():
        # kernels/models: fc1 784->512, relu, fc2 512->256, relu, out 256->10.
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10))

    def cnn():
        # kernels/models: conv 5x5x16 pad 2, relu, pool 2, conv 5x5x32 pad 2, relu, pool 2,
        # fc1 1568->128, relu, out 128->10.
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))

    def timed(fn, steps=50, groups=5):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        per = []
        for _ in range(groups):
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t0) / steps)
        return statistics.median(per) * 1e3

    for math, tf32 in (("fp32", False), ("tf32", True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        run_models(torch, nn, F, dev, math, mlp, cnn, timed)
    return 0


def run_models(torch, nn, F, dev, math, mlp, cnn, timed):
    for name, make, shape in (("mlp", mlp, (784,)), ("cnn", cnn, (1, 28, 28))):
        model = make().to(dev)
        params = list(model.parameters())
        host_params = [p.detach().cpu().pin_memory() for p in params]
        for batch in (128, 1024):
            x_host = torch.randn((batch,) + shape).pin_memory()
            y_host = (torch.arange(batch) % 10).pin_memory()
            x = x_host.to(dev)
            y = y_host.to(dev)
            grads_host = [torch.empty_like(h).pin_memory() for h in host_params]

            def compute():
                model.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                loss.backward()

            def with_transfers():
                with torch.no_grad():
                    for p, h in zip(params, host_params):
                        p.copy_(h, non_blocking=True)
                xb = x_host.to(dev, non_blocking=True)
                yb = y_host.to(dev, non_blocking=True)
                model.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                for p, g in zip(params, grads_host):
                    g.copy_(p.grad, non_blocking=True)
                loss_value = loss.item()  # Synchronises, as TrainStep returns the loss.
                return loss_value

            print(f"TORCH {name} {batch} {math} {timed(compute):.4f} {timed(with_transfers):.4f}")
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
