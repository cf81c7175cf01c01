"""Every `AERIE_*` name and what it means, in the order of the documented table: a node's and its
attempt's, the trainer's and S3's, the service side's, development's. `aerie_contracts.env`
re-exports each one (`env.API`); a new name goes into its group here.
"""

from aerie_contracts.env_var import define

# --- a node's contract (set by every backend, read by the agent and the trainer) -------------
ML_ROOT = define(
    "AERIE_ML_ROOT",
    "the node's /opt/ml (SageMaker's container layout) rooted in a directory; unset: /opt/ml (SageMaker)",
    "local and slurm backends, agent",
    "agent, trainer",
)
NODE_DIR = define(
    "AERIE_NODE_DIR", "the agent's own files (pids, exit files): always <ML root>/agent", "agent", "agent.rank"
)
METRICS_PATH = define(
    "AERIE_METRICS_PATH",
    "directory of the per-rank metrics JSONL stream (default <ML root>/output/metrics)",
    "agent",
    "trainer, agent",
)
WORKDIR = define("AERIE_WORKDIR", "where the entrypoint runs", "backend", "agent, trainer")
ENTRYPOINT = define(
    "AERIE_ENTRYPOINT", "JSON list: the spec's entrypoint + args, run on every rank", "backend", "agent"
)
PROCS_PER_NODE = define("AERIE_PROCS_PER_NODE", "ranks per node", "backend", "agent")
MASTER_ADDR = define(
    "AERIE_MASTER_ADDR",
    "rendezvous address where the backend knows it; else the first sorted host of resourceconfig.json",
    "local and slurm backends",
    "agent (agent.identity)",
)
MASTER_PORT = define(
    "AERIE_MASTER_PORT",
    "rendezvous port (backend_options.master_port); else derived from SLURM_JOB_ID, else 29500",
    "backend",
    "agent (agent.identity)",
)
# On Slurm, without AERIE_MASTER_PORT: 20000 + SLURM_JOB_ID % 20000, so concurrent jobs on one host
# (the emulated cluster) do not collide and every node of a job agrees on it; the slurm backend
# moves an in-place attempt's port within the same range.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 20000
# Without AERIE_MASTER_PORT or Slurm: the rendezvous port every node uses (agent.identity).
DEFAULT_MASTER_PORT = 29500
HEALTH = define("AERIE_HEALTH", "JSON of the spec's health section (aerie_contracts.health)", "backend", "agent")
SECTIONS = define(
    "AERIE_SECTIONS",
    "JSON {section: [recent durations, s]} the job's previous attempts learned (aerie_contracts.health.Section)",
    "controller (through every backend)",
    "agent",
)
# --- the attempt ------------------------------------------------------------------------------
API = define("AERIE_API", "the control plane's URL", "backend, operator", "agent, lambdas, cli")
AGENT_TOKEN = define("AERIE_AGENT_TOKEN", "bearer token valid only for this attempt's agents", "backend", "agent")
JOB = define("AERIE_JOB", "the job id", "backend", "trainer")
ATTEMPT = define("AERIE_ATTEMPT", "the attempt id", "backend", "agent, trainer")
ATTEMPT_NUMBER = define(
    "AERIE_ATTEMPT_NUMBER",
    "the attempt's number in its job's chain (1, 2, ...): the epoch in its checkpoint keys",
    "backend",
    "trainer",
)
RESUME_FROM = define("AERIE_RESUME_FROM", "checkpoint URI to resume from, or empty", "backend", "trainer")
IN_PLACE_WAIT_S = define(
    "AERIE_IN_PLACE_WAIT_S",
    "after its worker group ends, how long the agent waits for an in-place successor attempt (0 or unset: it exits)",
    "local, slurm and sagemaker backends",
    "agent",
)
SPARE = define(
    "AERIE_SPARE",
    "1 on a hot spare node (resources.spare_nodes): its agent runs no ranks until the control plane "
    "hands it a failed node's rank slot in an in-place attempt",
    "local and slurm backends",
    "agent",
)
SPARE_HOSTS = define(
    "AERIE_SPARE_HOSTS",
    "comma-separated hosts of the training job that are hot spares (resources.spare_nodes), the same on "
    "every instance: the agent of one of them is a spare (AERIE_SPARE), the others leave them out of the attempt",
    "sagemaker backend",
    "agent",
)
CHECKPOINT_URI = define("AERIE_CHECKPOINT_URI", "<checkpoint.s3_uri>/<job id>, or empty", "backend", "trainer")
CHECKPOINT_EVERY = define(
    "AERIE_CHECKPOINT_EVERY",
    "the spec's checkpoint.every_steps: a step count, or `auto` (the Young–Daly interval the trainer measures)",
    "backend",
    "trainer",
)
CHECKPOINT_MTBF_S = define(
    "AERIE_CHECKPOINT_MTBF_S",
    "with checkpoint.every_steps `auto`: seconds between failures of the job's allocation (all its nodes): "
    "the fleet's observed MTBF, else AERIE_MTBF_H's, over the node count",
    "control plane",
    "trainer",
)
LOG_METRICS = define(
    "AERIE_LOG_METRICS",
    'JSON {"preset", "definitions", "tensorboard"}: turn rank output lines (agent.rank) and TensorBoard '
    "event files (the agent) into metrics records (aerie_contracts.byo)",
    "backend",
    "agent, agent.rank",
)
PROBE = define(
    "AERIE_PROBE",
    "the spec's health.probe (`on`/`off`): `off` starts the ranks without the in-process probe (agent.inproc)",
    "agent",
    "agent.rank, the probe",
)
PROBE_RECORD_S = define(
    "AERIE_PROBE_RECORD_S",
    "seconds: the probe writes a step record at most this often (default 0.05; a faster loop's steps "
    "in between are folded into the next record; 0: every step)",
    "user",
    "the probe",
)
CHECKPOINT_LOCAL_PATH = define(
    "AERIE_CHECKPOINT_LOCAL_PATH",
    "the spec's checkpoint.local_path (a /opt/ml path lands under the node's ML root)",
    "backend",
    "agent",
)
CHECKPOINT_MARKER = define(
    "AERIE_CHECKPOINT_MARKER",
    "completion marker of a third-party trainer's checkpoints (aerie_contracts.byo.MARKERS or a glob)",
    "backend",
    "agent",
)
CHECKPOINT_DIR = define(
    "AERIE_CHECKPOINT_DIR",
    "the node's local checkpoint directory, the agent's resolution of checkpoint.local_path",
    "agent",
    "trainer (a third-party script's --output-dir)",
)
MEMORY_CHECKPOINT_EVERY = define(
    "AERIE_MEMORY_CHECKPOINT_EVERY",
    "the spec's checkpoint.memory_every_steps: a step count, `auto` (from the measured cost) or 0 (off)",
    "backend",
    "trainer",
)
MEMORY_CHECKPOINT_DIR = define(
    "AERIE_MEMORY_CHECKPOINT_DIR",
    "the node's shared-memory area for in-memory checkpoints (default /dev/shm/aerie-memckpt; on local and slurm, "
    "the control plane's value is the base of every node's own folder)",
    "local and slurm backends (a folder per node), the agent on SageMaker (agent/memckpt/platform.py), operator",
    "agent, trainer",
)
MEMORY_CHECKPOINT_PEERS = define(
    "AERIE_MEMORY_CHECKPOINT_PEERS",
    "the attempt's replication endpoints, `host=addr:port,...`: each agent serves its own and sends "
    "its ranks' snapshots to the next host's (a ring)",
    "local backend; on Slurm and SageMaker each node derives them",
    "agent",
)
MEMORY_CHECKPOINT_KEY = define(
    "AERIE_MEMORY_CHECKPOINT_KEY",
    "the attempt's replication secret (hex): every replication request and answer between the "
    "attempt's agents carries an HMAC made with it, and a stream without one is refused; a new one "
    "per attempt (an in-place successor's comes with GET .../next); never passed to the ranks",
    "backend (local, slurm, sagemaker: in the attempt's handle), agent (an in-place switch)",
    "agent",
)
MEMORY_RESUME_NODES = define(
    "AERIE_MEMORY_RESUME_NODES",
    "with a memory resume point: JSON {node: {ranks, replica_node}}, which node wrote each rank's snapshot "
    "and which holds its replica (a replacement node fetches its ranks' replicas from their holders)",
    "controller (a relaunch), agent (an in-place switch)",
    "agent",
)
RESUME_FALLBACK = define(
    "AERIE_RESUME_FALLBACK",
    "the durable (S3) checkpoint a memory resume point falls back to when any rank cannot restore its "
    "snapshot (empty: from scratch)",
    "controller (a relaunch), agent (an in-place switch)",
    "trainer",
)
CHANNEL_CACHE = define(
    "AERIE_CHANNEL_CACHE",
    "the per-host cache of File-mode channel downloads, keyed by ETag (default /var/tmp/aerie/channel-cache; "
    "`off`: download straight into the channel directory)",
    "operator (the control plane's value is passed to every node), local backend (one beside the jobs)",
    "agent",
)
FAULTS = define("AERIE_FAULTS", "JSON list of faults to inject (aerie submit --fault)", "cli", "trainer")
PREFLIGHT_FAULT = define(
    "AERIE_PREFLIGHT_FAULT",
    "test-only: make pre-flight checks fail, `cause[@host],...` (aerie_contracts.preflight.Fault: slow_compute, "
    "shm_full, store_unreachable, slow_link); passed to the nodes through the spec's env",
    "tests (the spec's env)",
    "agent",
)
# --- the trainer ------------------------------------------------------------------------------
DATA_CACHE = define("AERIE_DATA_CACHE", "where the built-in corpus and tokenizer are built once", "user", "trainer")
STOP_GRACE_S = define("AERIE_STOP_GRACE_S", "seconds a rank gets to finish a save after SIGTERM", "user", "trainer")
CODE_VERSION = define("AERIE_CODE_VERSION", "code version recorded in checkpoint manifests", "user", "trainer")
LOG_LEVEL = define("AERIE_LOG_LEVEL", "the trainer's log level", "user", "trainer")
EVAL_THREADS = define("AERIE_EVAL_THREADS", "torch threads of the eval sampler", "lambdas", "trainer")
# --- S3 ---------------------------------------------------------------------------------------
S3_ENDPOINT = define(
    "AERIE_S3_ENDPOINT", "S3 endpoint URL (else AWS_ENDPOINT_URL, else AWS)", "operator, cli", "trainer, control plane"
)
S3_PART_SIZE = define("AERIE_S3_PART_SIZE", "multipart upload part size, bytes", "user", "trainer")
S3_READ_PART_SIZE = define("AERIE_S3_READ_PART_SIZE", "ranged GET slice size, bytes", "user", "trainer")
S3_CONNECTIONS = define(
    "AERIE_S3_CONNECTIONS", "ranged GETs in flight across objects (default 16)", "user", "agent, trainer"
)
S3_THROUGHPUT_GBPS = define("AERIE_S3_THROUGHPUT_GBPS", "the CRT's target throughput", "user", "trainer")
S3_MAX_ATTEMPTS = define("AERIE_S3_MAX_ATTEMPTS", "S3 client retries", "user", "trainer")
S3_BUCKET = define("AERIE_S3_BUCKET", "the dev stack's bucket", "operator", "control plane")
# --- the control plane (orchestrator.settings.Settings reads AERIE_<field>) ---------------------
HOME = define(
    "AERIE_HOME", "the control plane's home (store, tokens, jobs); default ~/.aerie", "operator", "control plane, cli"
)
DATABASE_URL = define(
    "AERIE_DATABASE_URL", "SQLAlchemy URL of the store (default SQLite under AERIE_HOME)", "operator", "control plane"
)
HOST = define("AERIE_HOST", "address the API listens on", "operator", "control plane")
PORT = define("AERIE_PORT", "port the API listens on", "operator", "control plane")
PUBLIC_URL = define("AERIE_PUBLIC_URL", "URL agents and handlers use to reach the API", "operator", "control plane")
RECONCILE_INTERVAL_S = define(
    "AERIE_RECONCILE_INTERVAL_S", "seconds between reconcile passes", "operator", "control plane"
)
LOST_AFTER_HEARTBEATS = define(
    "AERIE_LOST_AFTER_HEARTBEATS",
    "a node with no heartbeat for this many heartbeat intervals (health.heartbeat_s) is lost (default 3)",
    "operator",
    "control plane",
)
EVENT_BUS = define(
    "AERIE_EVENT_BUS",
    "EventBridge bus (name or ARN) the outbox publishes to instead of calling the handlers in-process",
    "operator",
    "control plane",
)
WEB_HEALTH_EVERY_S = define(
    "AERIE_WEB_HEALTH_EVERY_S", "dashboard node-health sampling period", "operator", "control plane"
)
FAILPOINT = define(
    "AERIE_FAILPOINT", "test-only: name of a failpoint that crashes the process", "tests", "control plane, trainer"
)
ADMIN_TOKEN = define("AERIE_ADMIN_TOKEN", "bootstrap admin token (deployments)", "operator", "control plane")
DEFAULT_BACKEND = define(
    "AERIE_DEFAULT_BACKEND",
    "backend of a SageMaker-API CreateTrainingJob without an aerie:backend tag (default local)",
    "operator",
    "control plane",
)
SAGEMAKER_MAX_INSTANCES = define(
    "AERIE_SAGEMAKER_MAX_INSTANCES",
    "most instances a tenant's in-progress SageMaker-API jobs may hold (0: no limit; over it: ResourceLimitExceeded)",
    "operator",
    "control plane",
)
SIGV4_KEY = define(
    "AERIE_SIGV4_KEY",
    "hex key the AWS secret access keys of tokens are derived from (else AERIE_HOME/sigv4.key); same on every replica",
    "operator",
    "control plane",
)
METRICS_TOKEN = define(
    "AERIE_METRICS_TOKEN",
    "a bearer token that may only scrape /metrics (Prometheus); API tokens of a user work as well",
    "operator",
    "control plane",
)
MTBF_H = define(
    "AERIE_MTBF_H",
    "hours between failures per node the checkpoint-interval advice assumes until the fleet has observed its own",
    "operator",
    "control plane, cli",
)
MODEL_ARTIFACTS_URI = define(
    "AERIE_MODEL_ARTIFACTS_URI",
    "S3 URI the first node uploads model/ to as model.tar.gz after a clean run (SageMaker-API jobs)",
    "backend",
    "agent",
)
# --- clients and handlers -----------------------------------------------------------------------
TOKEN = define("AERIE_TOKEN", "the CLI's bearer token", "user", "cli")
SERVICE_TOKEN = define(
    "AERIE_SERVICE_TOKEN",
    "the handlers' bearer token; the control plane accepts it as a service token",
    "operator",
    "lambdas, control plane",
)
SERVICE_TOKEN_ARN = define("AERIE_SERVICE_TOKEN_ARN", "Secrets Manager ARN of the service token", "operator", "lambdas")
SLACK_BOT_TOKEN_ARN = define(
    "AERIE_SLACK_BOT_TOKEN_ARN", "Secrets Manager ARN of the Slack bot token", "operator", "lambdas"
)
SLACK_SIGNING_SECRET_ARN = define(
    "AERIE_SLACK_SIGNING_SECRET_ARN", "Secrets Manager ARN of Slack's signing secret", "operator", "lambdas"
)
SLACK_BOT_TOKEN = define(
    "AERIE_SLACK_BOT_TOKEN",
    "the Slack bot token (else SLACK_BOT_TOKEN, else the secret AERIE_SLACK_BOT_TOKEN_ARN names)",
    "operator",
    "control plane, lambdas",
)
SLACK_SIGNING_SECRET = define(
    "AERIE_SLACK_SIGNING_SECRET",
    "Slack's signing secret, checked on every interaction request (else SLACK_SIGNING_SECRET, else the secret "
    "AERIE_SLACK_SIGNING_SECRET_ARN names)",
    "operator",
    "control plane, lambdas",
)
SLACK_MAX_BODY_BYTES = define(
    "AERIE_SLACK_MAX_BODY_BYTES",
    "largest Slack interaction request body the API reads (default 65536); larger ones are refused",
    "operator",
    "control plane",
)
CHECKPOINT_BUCKET = define("AERIE_CHECKPOINT_BUCKET", "checkpoint bucket of a deployment", "operator", "lambdas")
CHECKPOINT_PREFIX = define("AERIE_CHECKPOINT_PREFIX", "checkpoint prefix of a deployment", "operator", "lambdas")
SLACK_API_URL = define(
    "AERIE_SLACK_API_URL", "Slack Web API base URL (tests point it at a stand-in)", "operator", "lambdas"
)
EVAL_SAMPLER_TIMEOUT_S = define("AERIE_EVAL_SAMPLER_TIMEOUT_S", "limit of one eval sampling run", "operator", "lambdas")
EVAL_SAMPLER_COMMAND = define(
    "AERIE_EVAL_SAMPLER_COMMAND",
    "JSON argv of the eval sampler (default: this Python with -m trainer.eval_sampler)",
    "operator, tests",
    "lambdas",
)
# --- backends ---------------------------------------------------------------------------------
SLURM_PARTITION = define("AERIE_SLURM_PARTITION", "default Slurm partition", "operator", "slurm backend")
SLURM_ACCOUNT = define("AERIE_SLURM_ACCOUNT", "default Slurm account", "operator", "slurm backend")
SLURM_PYTHON = define("AERIE_SLURM_PYTHON", "python on the Slurm nodes", "operator", "slurm backend")
SLURM_LAUNCH = define(
    "AERIE_SLURM_LAUNCH", "path of the attempt's launch.json on a Slurm node", "slurm backend", "agent"
)
SAGEMAKER = define("AERIE_SAGEMAKER", "enable the sagemaker backend", "operator", "sagemaker backend")
SAGEMAKER_ROLE_ARN = define(
    "AERIE_SAGEMAKER_ROLE_ARN", "execution role of training jobs", "operator", "sagemaker backend"
)
SAGEMAKER_SUBNETS = define("AERIE_SAGEMAKER_SUBNETS", "VPC subnets of training jobs", "operator", "sagemaker backend")
SAGEMAKER_SECURITY_GROUPS = define(
    "AERIE_SAGEMAKER_SECURITY_GROUPS", "security groups of training jobs", "operator", "sagemaker backend"
)
# --- development and tests (never read by the product) ------------------------------------------
TEST_PG = define(
    "AERIE_TEST_PG",
    "test-only: admin URL of the PostgreSQL server the tests and benches create their databases on "
    "(default postgresql+psycopg://postgres@127.0.0.1:5432/test)",
    "developer",
    "tests, bench",
)
UPDATE_GOLDEN = define(
    "AERIE_UPDATE_GOLDEN",
    "test-only: 1 rewrites the golden SageMaker requests (tests/data/sagemaker/)",
    "developer",
    "tests",
)
CLEAN_RUN_S = define(
    "AERIE_CLEAN_RUN_S", "test-only: seconds the integration clean run trains (default 600)", "developer", "tests"
)
TEST_EVAL_S = define(
    "AERIE_TEST_EVAL_S",
    "test-only: seconds the off-the-loop eval of the e2e test lasts (default 25)",
    "developer",
    "tests",
)
TRACE_IN_NS = define(
    "AERIE_TRACE_IN_NS",
    "test-only: set when tests/agent/record_traces.py re-runs itself inside its network namespace",
    "tests/agent/record_traces.py",
    "tests/agent/record_traces.py",
)
PYTHON = define(
    "AERIE_PYTHON",
    "the python infra/local/s3-server runs (default .venv/bin/python)",
    "developer",
    "infra/local/s3-server",
)
SLURM_DIR = define(
    "AERIE_SLURM_DIR",
    "the emulated Slurm cluster's scratch directory (default /tmp/aerie-slurm)",
    "developer",
    "infra/local/slurm",
)
SLURM_CTLD_PORT = define(
    "AERIE_SLURM_CTLD_PORT",
    "the emulated Slurm cluster's slurmctld port (default 16817)",
    "developer",
    "infra/local/slurm",
)
SLURM_NODE_PORT = define(
    "AERIE_SLURM_NODE_PORT",
    "the emulated Slurm cluster's first slurmd port (node1; the others the next ones; default 17001)",
    "developer",
    "infra/local/slurm",
)
SLURM_CPUS = define(
    "AERIE_SLURM_CPUS", "CPUs of each emulated Slurm node (default 2)", "developer", "infra/local/slurm"
)
