"""The one table of ``edged serve``'s settings (``OPTIONS``): each option's name, type, default, limits and help.
The flags, the config file's keys, the ``EDGED_*`` variables, ``edged config`` and the packaged ``edged.toml`` are
all derived from it (edged.config), so a setting is added here and nowhere else. It is one table, however long it
grows: split in parts, a setting's flag, key and help would no longer be found in the one place they are declared."""

from __future__ import annotations

from typing import Final

from edged.config.cache import check_cache_config
from edged.config.option import Option
from edged.config.values import (
    check_backend_config,
    check_categories,
    check_certificate_role,
    check_channel,
    check_config_name,
    check_device_id,
    check_header_pattern,
    check_metrics_config,
    check_rate,
    check_rate_limit,
    check_rate_limit_resource,
    check_repository,
    check_restricted,
)
from edged.core.tracing import check_trace_config

MIB: Final = 1024 * 1024


def _port(name: str, default: int, help_text: str) -> Option:
    return Option(name, "int", default, help_text, low=0, high=65535, metavar="PORT")


def _tls_options(prefix: str, endpoint: str) -> tuple[Option, ...]:
    """``--<prefix>-use-ssl``, ``-use-ssl-mutual``, ``-server-cert``, ``-server-key`` and ``-root-cert``."""
    return (
        Option(f"{prefix}-use-ssl", "bool", False, f"serve {endpoint} over TLS", metavar="BOOL"),
        Option(
            f"{prefix}-use-ssl-mutual",
            "bool",
            False,
            f"serve {endpoint} over mutual TLS: clients must present a certificate signed by --{prefix}-root-cert "
            f"(implies --{prefix}-use-ssl)",
            metavar="BOOL",
        ),
        Option(
            f"{prefix}-server-cert",
            "path",
            None,
            f"{endpoint} TLS: the server certificate (PEM, then any intermediates); re-read on reload",
            metavar="PATH",
            unset="none",
        ),
        Option(
            f"{prefix}-server-key",
            "path",
            None,
            f"{endpoint} TLS: the server certificate's private key (PEM); re-read on reload",
            metavar="PATH",
            unset="none",
        ),
        Option(
            f"{prefix}-root-cert",
            "path",
            None,
            f"{endpoint} mutual TLS: the CA certificates (PEM) that client certificates must be signed by; re-read "
            "on reload",
            metavar="PATH",
            unset="none",
        ),
    )


OPTIONS: Final[tuple[Option, ...]] = (
    Option(
        "model-repository",
        "path",
        [],
        "a model repository: a folder, s3://[host:port/]bucket/prefix or gs://bucket/prefix (synced into a local "
        "mirror); repeat the flag to serve several",
        repeatable=True,
        aliases=("model-store",),
        metavar="PATH",
        check=check_repository,
        remote=True,
        packaged='["/var/lib/edged/models"]',
    ),
    # Triton's default, so that health checks written for Triton that look for the server's name keep working.
    Option("id", "str", "triton", "the server name reported by GET /v2 (server metadata)", metavar="NAME"),
    Option("http-address", "str", "0.0.0.0", "address the HTTP endpoint binds", metavar="ADDR"),
    _port("http-port", 8000, "HTTP (KServe v2) port"),
    Option("http-max-input-size", "int", 64 * MIB, "largest request body accepted, in bytes", low=1, metavar="BYTES"),
    Option(
        "http-max-connections",
        "int",
        1024,
        "most HTTP connections open at once; at the limit a new one replaces the oldest that never sent a whole "
        "request head, else the one idle longest; only when all are amid a request is it answered 503",
        low=1,
        metavar="N",
    ),
    Option(
        "upload-max-bytes",
        "int",
        2 * 1024 * MIB,
        "largest model archive POST /v2/edged/models/{model}/upload accepts, in bytes (streamed to the state "
        "directory, never held in memory)",
        low=1,
        metavar="BYTES",
    ),
    Option(
        "upload-max-extracted-bytes",
        "int",
        8 * 1024 * MIB,
        "most bytes an uploaded model archive may hold once extracted (its members' sizes together)",
        low=1,
        metavar="BYTES",
    ),
    Option(
        "http-header-timeout-secs",
        "float",
        10.0,
        "how long a client may take to send a request's headers (and to begin one, or finish its TLS handshake, on "
        "a new connection)",
        low=0.1,
        high=3600,
        metavar="SECONDS",
    ),
    Option(
        "http-body-timeout-secs",
        "float",
        30.0,
        "a request body must bring at least --http-min-body-rate bytes per second over every window this long",
        low=0.1,
        high=3600,
        metavar="SECONDS",
    ),
    Option(
        "http-min-body-rate",
        "int",
        1024,
        "slowest a request body may arrive, in bytes per second (averaged over --http-body-timeout-secs)",
        low=0,
        metavar="BYTES",
    ),
    Option(
        "http-keepalive-timeout-secs",
        "float",
        30.0,
        "an idle kept-alive HTTP connection is closed after this long",
        low=0.1,
        high=86400,
        metavar="SECONDS",
    ),
    # Bounds on what one request may make the daemon hold or do (see the README's "Limits").
    Option(
        "http-max-json-depth",
        "int",
        100,
        "deepest nesting of arrays and objects accepted in a JSON request body (Triton: 100)",
        # The parser itself stops near Python's recursion limit (1000); past that every body would be refused.
        low=1,
        high=900,
        metavar="N",
    ),
    Option(
        "http-max-chunks",
        "int",
        65536,
        "most chunks in one chunked request body; one more is answered 400 and the connection closed (Triton: 65536)",
        low=1,
        metavar="N",
    ),
    Option(
        "grpc-max-queued-stream-bytes",
        "int",
        64 * MIB,
        "most bytes of responses a gRPC stream holds unread by its client; past this a decoupled model's request is "
        "cancelled with an error",
        low=1,
        metavar="BYTES",
    ),
    Option(
        "grpc-max-response-pool-size",
        "int",
        0,
        "most responses a gRPC stream holds unread by its client; past this a decoupled model's next response waits "
        "for the client to read (0: no count, --grpc-max-queued-stream-bytes only)",
        low=0,
        metavar="N",
    ),
    Option(
        "frontend-workers",
        "int",
        -1,
        "processes beside the daemon that serve the HTTP and gRPC ports on cores of their own (they read, check and "
        "answer requests; the models stay in the daemon, which runs every request); 0: none; -1: one for each 2 "
        "cores past the first 2, at most 6 (none on a device of 2 or 3 cores); not with TLS on HTTP or gRPC",
        low=-1,
        high=64,
        metavar="N",
    ),
    Option("allow-grpc", "bool", True, "serve KServe v2 over gRPC", metavar="BOOL"),
    Option("grpc-address", "str", "0.0.0.0", "address the gRPC endpoint binds", metavar="ADDR"),
    _port("grpc-port", 8001, "gRPC port"),
    Option(
        "grpc-max-connections",
        "int",
        1024,
        "most gRPC connections open at once; at the limit a new one replaces the oldest still in its handshake, "
        "else the one idle longest (sent GOAWAY); only when all have a call open is it closed at once",
        low=1,
        metavar="N",
    ),
    Option(
        "grpc-handshake-timeout-secs",
        "float",
        10.0,
        "how long a new gRPC connection may take to complete its HTTP/2 handshake",
        low=0.1,
        high=3600,
        metavar="SECONDS",
    ),
    Option(
        "grpc-idle-timeout-secs",
        "float",
        600.0,
        "a gRPC connection with no call for this long is closed (clients reconnect on their next call)",
        low=1,
        high=86400 * 7,
        metavar="SECONDS",
    ),
    Option(
        "grpc-body-timeout-secs",
        "float",
        30.0,
        "a gRPC request must bring at least --grpc-min-body-rate bytes per second (and one byte) over every window "
        "this long; a reply whose client reads nothing, or opens no window for it, for this long is dropped",
        low=0.1,
        high=3600,
        metavar="SECONDS",
    ),
    Option(
        "grpc-min-body-rate",
        "int",
        1024,
        "slowest a gRPC request may arrive, in bytes per second (averaged over --grpc-body-timeout-secs); a call "
        "slower than this is answered DEADLINE_EXCEEDED",
        low=0,
        metavar="BYTES",
    ),
    Option(
        "grpc-max-buffered-bytes",
        "int",
        256 * MIB,
        "most bytes of gRPC requests the daemon holds before they are whole, over every connection (one connection "
        "may hold a quarter of it, or one largest message if more); a call past it is answered RESOURCE_EXHAUSTED",
        low=1,
        metavar="BYTES",
    ),
    Option(
        "grpc-max-message-size",
        "int",
        64 * MIB,
        "largest gRPC message received or sent, in bytes: a safety limit (Triton allows 2147483647)",
        # gRPC keeps message sizes in a signed 32-bit int.
        low=1,
        high=2**31 - 1,
        metavar="BYTES",
    ),
    # --- access control (edged.core.access; README "Securing edged") ---
    Option(
        "http-restricted-api",
        "str",
        [],
        "Triton's restricted APIs over HTTP: these categories need header KEY with VALUE (repeatable)",
        repeatable=True,
        metavar="APIS:KEY=VALUE",
        check=check_restricted,
    ),
    Option(
        "grpc-restricted-protocol",
        "str",
        [],
        "Triton's restricted protocols over gRPC: these categories need metadata triton-grpc-protocol-KEY with VALUE "
        "(repeatable)",
        repeatable=True,
        metavar="APIS:KEY=VALUE",
        check=check_restricted,
    ),
    Option(
        "guarded-apis",
        "str",
        "model-repository,shared-memory,logging,trace",
        "API categories a client needs an API token for (or to be on loopback, when trusted): a list, all or none",
        metavar="APIS",
        check=check_categories,
    ),
    Option(
        "client-certificate-role",
        "str",
        [],
        "with mutual TLS: the role a verified client certificate stands for, by its subject CN (repeatable)",
        repeatable=True,
        metavar="CN=ROLE",
        check=check_certificate_role,
    ),
    Option(
        "trust-loopback",
        "bool",
        True,
        "let clients on the loopback interface (tools on the device) call guarded APIs without a token, except "
        "token management, uploads and loads with overrides (code the daemon would run)",
        metavar="BOOL",
    ),
    # TLS: gRPC with Triton's own flags, HTTP with flags of the same shape; the metrics port reuses HTTP's files.
    *_tls_options("grpc", "gRPC"),
    *_tls_options("http", "HTTP"),
    Option(
        "metrics-use-ssl",
        "bool",
        False,
        "serve /metrics over TLS with the HTTP endpoint's files (--http-server-cert, --http-server-key, and "
        "--http-root-cert when --http-use-ssl-mutual)",
        metavar="BOOL",
    ),
    Option(
        "allow-client-shm",
        "bool",
        False,
        "let clients register system shared memory regions for tensors (the shared memory extension)",
        metavar="BOOL",
    ),
    *(
        Option(
            f"{wire}-header-forward-pattern",
            "str",
            None,
            f"forward the {title} request headers whose names this regular expression finds (any case unless it "
            "starts with (?-i)) to the model as string request parameters",
            metavar="REGEX",
            check=check_header_pattern,
            unset="none forwarded",
        )
        for wire, title in (("http", "HTTP"), ("grpc", "gRPC"))
    ),
    Option("allow-metrics", "bool", True, "serve Prometheus metrics", metavar="BOOL"),
    Option(
        "metrics-address",
        "str",
        None,
        "address the metrics endpoint binds",
        metavar="ADDR",
        unset="the HTTP address",
    ),
    _port("metrics-port", 8002, "metrics port (/metrics)"),
    Option(
        "allow-console",
        "bool",
        True,
        "serve the web console (model uploads, versions, live metrics, history) on its own port; it needs a state "
        "directory for its users and sessions",
        metavar="BOOL",
    ),
    Option(
        "console-address",
        "str",
        None,
        "address the web console binds (keep it on a trusted network)",
        metavar="ADDR",
        unset="the HTTP address",
    ),
    _port("console-port", 8080, "web console port"),
    Option(
        "console-use-ssl",
        "bool",
        False,
        "serve the web console over TLS with the HTTP endpoint's --http-server-cert and --http-server-key (its "
        "session cookie is then Secure)",
        metavar="BOOL",
    ),
    Option("allow-cpu-metrics", "bool", True, "report CPU utilization and memory", metavar="BOOL"),
    Option(
        "allow-gpu-metrics",
        "bool",
        True,
        "report NVIDIA GPU utilization, memory and power (when present)",
        metavar="BOOL",
    ),
    Option(
        "metrics-interval-ms",
        "int",
        2000,
        "how often the CPU and GPU metrics are refreshed, in milliseconds",
        low=1,
        metavar="MS",
    ),
    Option(
        "metrics-config",
        "str",
        [],
        "latency metrics: counter_latencies, histogram_latencies, summary_latencies (true/false), "
        "summary_quantiles (q:e,...)",
        repeatable=True,
        metavar="KEY=VALUE",
        check=check_metrics_config,
    ),
    Option("exit-on-error", "bool", False, "exit when a model fails to load at start-up", metavar="BOOL"),
    Option("strict-readiness", "bool", True, "report ready only when every model is ready", metavar="BOOL"),
    Option(
        "disable-auto-complete-config",
        "bool",
        False,
        "require complete config.pbtxt files instead of reading missing fields from the models",
        metavar="BOOL",
    ),
    Option(
        "strict-model-config",
        "bool",
        None,
        "Triton's older name for --disable-auto-complete-config (deprecated), which wins over it when both are given",
        metavar="BOOL",
        unset="not given",
    ),
    Option(
        "backend-directory",
        "path",
        None,
        "where Python-based backends are found: a folder NAME/ holding a model.py serves the models whose config "
        "says backend: NAME (Triton's flag; edged's own backends are built in)",
        metavar="DIR",
        unset="none",
    ),
    Option("model-load-thread-count", "int", 4, "models loaded in parallel", low=1, metavar="N"),
    Option(
        "model-load-retry-count",
        "int",
        0,
        "times a model version that fails to load is loaded again before it is given up",
        low=0,
        high=100,
        metavar="N",
    ),
    Option(
        "model-config-name",
        "str",
        None,
        "read each model's configuration from configs/NAME.pbtxt in its folder where there is one, else from "
        "config.pbtxt",
        metavar="NAME",
        unset="none",
        check=check_config_name,
    ),
    Option(
        "model-control-mode",
        "choice",
        "none",
        "none: load every model at start; poll: also follow changes; explicit: the load/unload API decides",
        choices=("none", "poll", "explicit"),
        metavar="MODE",
        # The service serves as scripts/run does: an upload (the console's among them) is activated without a
        # restart, and the load API or the console loads a model copied in. The command line keeps Triton's default.
        packaged='"explicit"',
    ),
    Option(
        "repository-poll-secs",
        "float",
        15.0,
        "how often poll mode scans the repositories, in seconds",
        low=0.1,
        high=86400,
        metavar="SECONDS",
    ),
    Option(
        "load-model",
        "str",
        [],
        "explicit mode: a model to load at start (repeatable; '*' loads every model)",
        repeatable=True,
        metavar="NAME",
        # With the packaged explicit mode: every model of the repository still loads at start, as under "none".
        packaged='["*"]',
    ),
    Option(
        "state-dir",
        "path",
        None,
        "where the state database and private model copies live",
        metavar="DIR",
        unset="$STATE_DIRECTORY, /var/lib/edged under systemd, else $XDG_STATE_HOME/edged or ~/.local/state/edged",
        # Named, so that `edged token` and `edged admin`, run from a shell, find the service's database through
        # this file as the service does through $STATE_DIRECTORY.
        packaged='"/var/lib/edged"',
    ),
    Option(
        "history-per-model",
        "int",
        10_000,
        "model history events kept per model in the state database (the newest; older ones are dropped)",
        low=100,
        metavar="N",
    ),
    # Repository sync (s3:// and gs:// repositories).
    Option(
        "sync-interval-secs",
        "float",
        300.0,
        "how often remote repositories are synced, in seconds (give or take 10%, so that a fleet spreads out)",
        low=1,
        metavar="SECONDS",
    ),
    Option(
        "sync-max-rate",
        "str",
        "0",
        "bandwidth cap of sync downloads in bytes a second, e.g. 500k or 2M (0: no cap)",
        metavar="RATE",
        check=check_rate,
    ),
    Option(
        "sync-trusted-root",
        "path",
        None,
        "the root.json of signed repositories (edged publish): when set, only signed revisions are taken",
        metavar="FILE",
        unset="none: unsigned repositories are synced by their object digests",
    ),
    Option(
        "sync-channel",
        "str",
        None,
        "follow this channel (e.g. stable, canary): the folder of that name under each remote repository",
        metavar="NAME",
        unset="none",
        check=check_channel,
    ),
    Option(
        "device-id",
        "str",
        None,
        "this device's name in fleet status reports",
        metavar="NAME",
        unset="the host name",
        check=check_device_id,
    ),
    Option(
        "sync-report-status",
        "bool",
        False,
        "write this device's status (revision, models, last error) to <repository>/.edged/devices/ after each sync",
        metavar="BOOL",
    ),
    Option(
        "sync-probation-secs",
        "float",
        60.0,
        "how long updated models are watched before their revision is committed as last known good (also: an "
        "activated upload, removed again when it fails)",
        low=0,
        metavar="SECONDS",
    ),
    Option(
        "sync-max-error-rate",
        "float",
        0.1,
        "the share of failed requests (of at least 10) that fails an updated model's or an activated upload's "
        "probation",
        low=0,
        high=1,
        metavar="RATE",
    ),
    Option(
        "sync-sequence-wait-secs",
        "float",
        60.0,
        "how long an updated model with live sequences keeps its old revision before it is swapped anyway",
        low=0,
        metavar="SECONDS",
    ),
    Option(
        "sync-timeout-secs",
        "float",
        60.0,
        "how long a sync request to the object store may take (a stalled link fails the run; the next resumes)",
        low=1,
        metavar="SECONDS",
    ),
    Option(
        "rate-limit",
        "str",
        "off",
        "Triton's rate limiter: execution_count runs an execution only when the resources its instance group's "
        "rate_limiter names are free, serving waiting instances by priority; off runs one whenever it is free",
        metavar="execution_count|off",
        check=check_rate_limit,
    ),
    Option(
        "rate-limit-resource",
        "str",
        [],
        "how many of a rate limiter resource there are, on DEVICE or on every device (repeatable); a resource not "
        "given has as many as the most any instance asks for",
        repeatable=True,
        metavar="NAME:COUNT[:DEVICE]",
        check=check_rate_limit_resource,
    ),
    Option(
        "backend-config",
        "str",
        [],
        "backend settings, e.g. python,stub-timeout-seconds=30 or default-max-batch-size=8 (repeatable)",
        repeatable=True,
        metavar="[BACKEND,]KEY=VALUE",
        check=check_backend_config,
    ),
    Option(
        "cache-config",
        "str",
        [],
        "the response cache, as Triton's: local,size=BYTES keeps the responses of models whose config enables "
        "response_cache, within BYTES for the whole device, least recently used out first; none when not given",
        repeatable=True,
        metavar="CACHE,KEY=VALUE",
        check=check_cache_config,
    ),
    Option(
        "trace-config",
        "str",
        [],
        "Triton's trace extension: level=OFF|TIMESTAMPS|TENSORS, rate=N (every Nth request), count=N (-1: no end), "
        "log_frequency=N (traces per FILE.N; 0: all into FILE), triton,file=FILE, mode=triton (repeatable)",
        repeatable=True,
        metavar="[MODE,]KEY=VALUE",
        check=check_trace_config,
    ),
    Option(
        "exit-timeout-secs",
        "float",
        30.0,
        "on shutdown, how long to wait for in-flight requests to finish, in seconds",
        low=0,
        high=86400,
        metavar="SECONDS",
    ),
    Option("log-verbose", "int", 0, "verbose logging when above 0", metavar="LEVEL"),
    Option("log-info", "bool", True, "write INFO lines", metavar="BOOL"),
    Option("log-warning", "bool", True, "write WARNING lines", metavar="BOOL"),
    Option("log-error", "bool", True, "write ERROR lines", metavar="BOOL"),
    Option(
        "log-format",
        "choice",
        "default",
        "the layout of text lines: Triton's default (glog's) or ISO8601 (UTC timestamps)",
        choices=("default", "ISO8601"),
        metavar="FORMAT",
    ),
    Option(
        "log-file",
        "path",
        None,
        "append text lines to this file instead of stderr or the journal",
        metavar="PATH",
        unset="stderr, or the journal under systemd",
    ),
)

BY_KEY: Final = {option.key: option for option in OPTIONS}
