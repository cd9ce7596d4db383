"""``--tls``: what TLS costs. add_sub on edged over plaintext and over TLS (a certificate made for the run by
trustme, RSA 2048, TLS 1.3), one daemon after the other in the same run, over HTTP and gRPC unary calls at
concurrency 1, 8 and 16. Its results go under the ``tls`` key of bench-results.json."""

from __future__ import annotations

import argparse
import ssl
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Final

import onnxruntime as ort

from .common import BENCH_DIR, CONCURRENCIES, PROTOCOLS, Phase
from .cpu import Retries, check_idle
from .load import choose_load
from .machine import machine_info
from .measure import measure_server
from .measurement import TLS_MODES, Row, SharedMemory
from .models import bench_models, prepare_models
from .results import (
    fmt_measured,
    fmt_ratio,
    fmt_us,
    markdown,
    p50_difference,
    print_caveats,
    print_saved,
    run_info,
    save_results,
)
from .servers import edged_command, free_ports

TLS_HEADER: Final = (
    "conc",
    "protocol",
    "plaintext infer/s",
    "plaintext p50 us",
    "TLS infer/s",
    "TLS p50 us",
    "TLS/plaintext",
    "TLS - plaintext p50 us",
)
TLS_TEXT_COLUMNS: Final = 2


def tls_table(pairs: Sequence[tuple[Row, Row]]) -> str:
    """One line per concurrency and protocol from pairs of rows: (plaintext, TLS)."""
    body = [
        (
            str(plain.concurrency),
            plain.protocol,
            fmt_measured(plain.edged),
            fmt_us(plain.edged.p50_us, plain.edged.stable),
            fmt_measured(tls.edged),
            fmt_us(tls.edged.p50_us, tls.edged.stable),
            fmt_ratio(tls.edged, plain.edged),
            p50_difference(tls.edged, plain.edged),
        )
        for plain, tls in pairs
    ]
    return markdown(TLS_HEADER, body, TLS_TEXT_COLUMNS)


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signed for 127.0.0.1, made for this run: (CA, certificate, key)."""
    import trustme  # a test dependency, which scripts/setup installs

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    files = (directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files[0].write_bytes(ca.cert_pem.bytes())
    files[1].write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    files[2].write_bytes(leaf.private_key_pem.bytes())
    return files


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The TLS phase: the same model and load on edged over plaintext, then on edged over TLS."""
    began = time.monotonic()
    quick = args.quick
    modes = [m for m in TLS_MODES if m.protocol in (args.protocols or PROTOCOLS)]
    machine = machine_info()
    models = [m for m in bench_models(quick) if m.name == "add_sub"]
    prepare_models(models)
    chosen = choose_load(modes)
    if chosen is None:
        return 2
    load, modes, _ = chosen
    concurrencies = (1, 8) if quick else CONCURRENCIES
    retries = Retries.for_run(quick)
    rows = {(m.name, mode.name, c): Row(m.name, c, mode.name) for m in models for mode in modes for c in concurrencies}
    shm = SharedMemory()  # not used: these rows send tensors over the socket
    ca, cert, key = make_certificates(BENCH_DIR / "tls")
    load.tls_ca = ca
    client = ssl.create_default_context(cafile=ca)

    busy: dict[str, float] = {}
    plain_modes = [m for m in modes if not m.tls]
    ports = free_ports()
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged_command(ports), ports, models, plain_modes, load, rows, shm, retries, concurrencies)
    ports = free_ports()
    tls_flags = [
        f"--{wire}-{flag}" for wire in ("http", "grpc") for flag in (f"server-cert={cert}", f"server-key={key}")
    ]
    command = [*edged_command(ports), "--http-use-ssl", "--grpc-use-ssl", *tls_flags]
    busy["edged tls"] = check_idle("edged tls")
    tls_modes = [m for m in modes if m.tls]
    measure_server(
        "edged",
        command,
        ports,
        models,
        tls_modes,
        load,
        rows,
        shm,
        retries,
        concurrencies,
        tls=client,
        name="edged-tls",
    )

    pairs = [
        (rows[m.name, mode.name, c], rows[m.name, f"{mode.name} tls", c])
        for m in models
        for c in concurrencies
        for mode in plain_modes
    ]
    measured = [row.edged for pair in pairs for row in pair]
    print()
    print(tls_table(pairs))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    print(
        "model: add_sub (FP32 [1,16]); TLS: a certificate made for the run (trustme: RSA 2048), the client "
        "verifies it; connections are kept open, so the handshake is paid once per client"
    )
    if machine["edged"]:
        print(f"edged: {machine['edged']}")
    labelled = [(row, "edged", row.edged) for pair in pairs for row in pair]
    failed = print_caveats(measured, measured, busy, labelled)

    save_results(
        "tls",
        {
            **run_info(argv, machine, load),
            "protocols": [m.name for m in modes],
            "cpu_busy_before": busy,
            "rows": [
                {
                    "concurrency": plain.concurrency,
                    "protocol": plain.protocol,
                    "plaintext": asdict(plain.edged),
                    "tls": asdict(tls.edged),
                }
                for plain, tls in pairs
            ],
        },
    )
    print_saved(began, "tls")
    return 1 if failed else 0


PHASE: Final = Phase(
    "--tls",
    "only the TLS comparison: add_sub on edged over TLS against plaintext (HTTP and gRPC unless "
    "--protocols says otherwise)",
    run,
)
