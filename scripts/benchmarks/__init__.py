"""Measures how close edged comes to running ONNX Runtime in-process, and to Triton on the same machine.

For each model, protocol and concurrency it measures, one after the other so they never compete for cores:

1. in-process: threads calling ``InferenceSession.run`` on one session in a closed loop (the ceiling);
2. edged: the real daemon driven by Triton's ``perf_analyzer`` over each protocol:

   - ``http``: HTTP/REST with binary tensors;
   - ``grpc``: gRPC ``ModelInfer`` calls, one in flight per concurrent client;
   - ``grpc stream``: gRPC ``ModelStreamInfer``, one stream per concurrent client;
   - ``http shm`` and ``grpc shm``: inputs and outputs in system shared memory regions that perf_analyzer
     registers (``--shared-memory system``), so no tensor bytes travel over the socket;

3. Triton: Triton Inference Server serving the same model.onnx through a Python-backend model that runs
   onnxruntime (the reference build has no ONNX Runtime backend), with the same perf_analyzer commands.

With ``--batching`` it measures dynamic batching instead, on the ResNet-50-shaped model only:

1. in-process: one thread running ``InferenceSession.run`` on batches of 1, 2, 4, 8 and 16 images back to back;
   the best images per second is the ceiling every ratio divides by;
2. edged and Triton, each serving four models over the same model.onnx: without batching and with
   ``dynamic_batching``, each with one and with two instances, driven by perf_analyzer at concurrency 1, 4, 8 and
   16 with batch-1 requests (HTTP unless ``--protocols`` says otherwise). The servers' statistics give the mean
   batch they executed.

With ``--python`` it measures what a Python-backend model costs: the repository's add_sub_python
(tests/testdata/python_models/add_sub_python, Triton's add_sub example as model.py, two instances) against the
ONNX add_sub with as many instances, both on edged (each Python request crosses to a stub process and back), and
against Triton's own Python backend serving the same model.py (where it passes response parameters, it does
so only when there are some, as Triton 2.51 requires) and config.pbtxt. perf_analyzer drives each at
concurrency 1, 8 and 16 with batch-1 requests (HTTP unless ``--protocols`` says otherwise). Its results go under
the ``python`` key of bench-results.json, beside what other runs left there.

With ``--sync`` it measures repository sync instead: edged's ``sync_once`` against ``aws s3 sync`` on the same
moto S3 server, full downloads of a ~300 MB repository and of a 1,000-file one, then one changed file; see
scripts/benchmarks/sync.py. Its results go under the ``sync`` key of bench-results.json.

With ``--tls`` it measures what TLS costs: add_sub on edged over plaintext and over TLS (a certificate made for
the run by trustme, RSA 2048, TLS 1.3), one daemon after the other in the same run, over HTTP and gRPC unary
calls at concurrency 1, 8 and 16. Its results go under the ``tls`` key of bench-results.json.

Run it through ``scripts/bench``, which sets up the checkout first::

    scripts/bench                       # add_sub and resnet50, every protocol, concurrency 1, 8, 16
    scripts/bench --quick               # add_sub only, short windows
    scripts/bench --protocols grpc      # only the gRPC rows (unary, streaming, shared memory)
    scripts/bench --skip-triton         # edged and in-process only
    scripts/bench --skip-shm            # no shared-memory rows
    scripts/bench --batching            # dynamic batching and instance counts on resnet50 (about 10 minutes)
    scripts/bench --batching --quick    # the same at concurrency 1 and 8, short windows
    scripts/bench --python              # Python-backend add_sub against the ONNX one and Triton (a few minutes)
    scripts/bench --python --quick      # the same with short windows
    scripts/bench --tls                 # add_sub over TLS against plaintext, HTTP and gRPC (a few minutes)
    scripts/bench --tls --quick         # the same at concurrency 1 and 8, short windows
    scripts/bench --sync                # repository sync against aws s3 sync on moto (a few minutes)
    scripts/bench --sync --quick        # the same with a ~60 MB repository and fewer runs
    scripts/bench --console             # the web console's memory and server time per page
    scripts/bench --footprint           # idle memory, start times, a Python instance's cost, installed size

perf_analyzer 2.60 loads the CUDA runtime (libcudart) whenever it runs with shared memory, even system shared
memory, and stops when it cannot. Loading the library needs no GPU, so before the first shared-memory run the
benchmark puts libcudart from NVIDIA's CUDA runtime wheel into perf_analyzer's root (``$PA_ROOT``, never into
../shared); when that is not possible it says why and leaves the shared-memory rows out.

The measurements assume an otherwise idle machine. Each phase first waits a while for other processes to leave
the CPU, and every measurement records how much CPU they used meanwhile (everything but this process, the load
generator and the server under test). A measurement they disturbed is taken again once when the CPU is quiet
(within a time budget); a figure still marked ``!`` in the table was disturbed and is worth measuring again.

With ``--footprint`` it measures what edged costs the device: idle memory of the daemon and its children by
process and by mapping, cold start to READY, the CLI's start, a Python-backend instance's cost and the
virtualenv's size by distribution; see scripts/benchmarks/footprint.py. Its results go under the ``footprint`` key.

Generated models, server logs and the results (bench-results.json) go to bench-models/, which git ignores.

Each phase is one module of scripts/benchmarks/ (protocols.py, batching.py, ...), listed in its cli.py.
"""
