"""The AWS CDK app in infra/aws, synthesized in-process and checked resource by resource.

Synthesis uses `aws-cdk-lib` (Python; jsii runs the library on this machine's Node.js) and
`aws_cdk.assertions.Template.from_stack`, which needs neither the `aws-cdk` CLI nor AWS
credentials. One synth takes 10-25 s on this 2-core machine (most of it jsii start-up), so the
documented app is built once per module; a second synth covers the non-default options (HTTPS,
expiry, no retention). The context is cdk.json's plus the `-c` values of the deploy command in
README.md's Deploy to AWS section, read from that file, so the template checked is the one people deploy.

One slow test runs the documented `npx aws-cdk@2 synth` itself (40-55 s; it fetches the CLI from
the npm registry the first time) and checks it produces the same resources.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.eventbridge_pattern import matches

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra" / "aws"
DEPLOY_DOC = REPO / "README.md"  # its "Deploy to AWS" section
EVENTS = Path(__file__).resolve().parent / "events"

HANDLERS = ("chain_restart", "checkpoint_gc", "eval_dispatch", "slack_interactions")

# Quiet jsii's banner about this machine's Node.js version; it changes nothing in the output.
for _flag in ("DEPRECATED", "UNTESTED", "END_OF_LIFE"):
    os.environ.setdefault(f"JSII_SILENCE_WARNING_{_flag}_NODE_VERSION", "1")


# --- the documented commands ------------------------------------------------------------------


def documented_commands(prefix: str) -> list[list[str]]:
    """Shell lines of the deploy doc's code blocks that start with `prefix`, split like a shell."""
    text = DEPLOY_DOC.read_text().split("## Deploy to AWS", 1)[1]
    blocks = re.findall(r"```(?:sh|bash|shell)?\n(.*?)```", text, flags=re.S)
    lines = [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(prefix)]


def context_args(argv: list[str]) -> dict[str, str]:
    context: dict[str, str] = {}
    for flag, value in itertools.pairwise(argv):
        if flag in ("-c", "--context"):
            key, _, val = value.partition("=")
            context[key] = val
    return context


def deploy_context() -> dict[str, str]:
    synth = documented_commands("npx aws-cdk@2 synth")
    deploy = documented_commands("npx aws-cdk@2 deploy")
    assert synth and deploy, (
        "README.md's Deploy to AWS section must show `npx aws-cdk@2 synth` and `npx aws-cdk@2 deploy`"
    )
    contexts = [context_args(argv) for argv in synth + deploy]
    assert all(c == contexts[0] for c in contexts), "synth and deploy must use the same -c values"
    return contexts[0]


def test_documented_image_builds_match_the_stack_settings():
    """The doc's `docker build`/`docker push` lines use the real Dockerfiles, repositories and tag."""
    sys.path.insert(0, str(INFRA))
    from aerie_cdk.settings import Settings

    defaults = Settings()
    tag = deploy_context().get("aerie:imageTag", defaults.image_tag)
    builds = documented_commands("docker build")
    pushes = {argv[-1] for argv in documented_commands("docker push")}
    assert len(builds) == 2
    for argv in builds:
        dockerfile = argv[argv.index("-f") + 1]
        image = argv[argv.index("-t") + 1]
        assert (REPO / dockerfile).is_file() and argv[-1] == "."
        repository = defaults.trainer_repository if "trainer" in dockerfile else defaults.control_plane_repository
        assert image == f"$REGISTRY/{repository}:{tag}"
        assert image in pushes


# --- synthesis ------------------------------------------------------------------------------------


def _load_app_module():
    spec = importlib.util.spec_from_file_location("aerie_infra_app", INFRA / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    from aws_cdk.assertions import Template

    app_module = _load_app_module()
    context = {**app_module.cdk_json_context(), **deploy_context()}
    outdir = tmp_path_factory.mktemp("cdk.out")
    _app, stack = app_module.build_app(context=context, outdir=str(outdir))
    template = Template.from_stack(stack)
    return stack, template, template.to_json(), outdir


@pytest.fixture(scope="module")
def template(synthesized):
    return synthesized[1]


@pytest.fixture(scope="module")
def resources(synthesized) -> dict:
    return synthesized[2]["Resources"]


def of_type(resources: dict, kind: str) -> dict:
    return {name: r for name, r in resources.items() if r["Type"] == kind}


def load_event(name: str) -> dict:
    return json.loads((EVENTS / f"{name}.json").read_text())


# --- Lambda functions ---------------------------------------------------------------------------


def test_each_handler_is_a_python_lambda_with_its_module_handler(template, resources):
    functions = of_type(resources, "AWS::Lambda::Function")
    by_handler = {f["Properties"].get("Handler"): f for f in functions.values()}
    for module in HANDLERS:
        fn = by_handler.get(f"lambdas.{module}.handler")
        assert fn is not None, f"no Lambda function runs lambdas.{module}.handler"
        props = fn["Properties"]
        assert props["Runtime"] in ("python3.11", "python3.12")
        env = props["Environment"]["Variables"]
        assert "AERIE_API" in env and "AERIE_SERVICE_TOKEN_ARN" in env
        # Own role, no AWS managed policy (AWSLambdaBasicExecutionRole writes to every log group).
        role_name = props["Role"]["Fn::GetAtt"][0]
        assert not resources[role_name]["Properties"].get("ManagedPolicyArns")
        assert "LoggingConfig" in props


def test_handler_bundle_holds_the_handlers_and_the_checkpoint_kernel_but_no_trainer(synthesized, resources):
    _stack, _template, _json, outdir = synthesized
    functions = [
        f
        for f in of_type(resources, "AWS::Lambda::Function").values()
        if f["Properties"].get("Handler", "").startswith("lambdas.")
    ]
    asset_keys = {f["Properties"]["Code"]["S3Key"] for f in functions}
    assert len(asset_keys) == 1, "the four handlers share one code asset"
    asset_hash = next(iter(asset_keys)).split(".")[0]
    bundle = Path(outdir) / f"asset.{asset_hash}"
    assert bundle.is_dir()
    assert not (bundle / "trainer").exists(), "the trainer needs torch; the handlers import none of it"
    kernel = {p.name for p in (bundle / "aerie_checkpoint").glob("*.py")}
    assert {"__init__.py", "storage.py", "manifest.py", "gc.py", "fence.py"} <= kernel
    assert (bundle / "slack_sdk").is_dir() and (bundle / "httpx").is_dir()
    assert (bundle / "aerie_s3" / "settings.py").is_file()  # what aerie_checkpoint/storage.py builds on
    assert not any(bundle.rglob("*.so")), "the bundle must be pure Python"
    assert not (bundle / "torch").exists() and not (bundle / "boto3").exists()
    for module in HANDLERS:
        if not (REPO / "lambdas" / f"{module}.py").exists():
            continue  # written by another issue; the function already points at it
        source = (bundle / "lambdas" / f"{module}.py").read_text()
        assert re.search(r"^def handler\(", source, flags=re.M), f"lambdas/{module}.py has no handler()"


IMPORT_FROM_BUNDLE = """
import importlib, importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy", "s3torchconnector"):
            raise ImportError(f"{name} imported from a Lambda handler bundle")
sys.meta_path.insert(0, NoTorch())
bundle = sys.argv[1]
sys.path.insert(0, bundle)
for module in sys.argv[2:]:
    loaded = importlib.import_module(module)
    assert loaded.__file__.startswith(bundle), (module, loaded.__file__)
    if module.startswith("lambdas.") and module.count(".") == 1:
        assert callable(loaded.handler), module
"""


def test_handler_bundle_imports_without_torch_or_the_repo(synthesized, resources):
    """What the Lambda runtime will do: import each handler and the manifest from the bundle alone."""
    outdir = synthesized[3]
    (code,) = {
        f["Properties"]["Code"]["S3Key"]
        for f in of_type(resources, "AWS::Lambda::Function").values()
        if f["Properties"].get("Handler", "").startswith("lambdas.")
    }
    bundle = Path(outdir) / f"asset.{code.split('.')[0]}"
    modules = ["aerie_checkpoint.manifest", "slack_sdk", "httpx"]
    modules += [f"lambdas.{m}" for m in HANDLERS if (REPO / "lambdas" / f"{m}.py").exists()]
    result = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_FROM_BUNDLE, str(bundle), *modules],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]


# --- EventBridge rules ----------------------------------------------------------------------------


def rule_targets(resources: dict, rule: dict) -> set[str]:
    """Handler modules a rule invokes."""
    handlers = set()
    for target in rule["Properties"]["Targets"]:
        fn_name = target["Arn"]["Fn::GetAtt"][0]
        handlers.add(resources[fn_name]["Properties"]["Handler"].split(".")[1])
    return handlers


# Which handlers each event the control plane publishes must reach (the rules' contract).
ROUTED = [
    ("aerie_attempt_failed", {"chain_restart"}),
    ("aerie_attempt_running", set()),
    ("aerie_checkpoint_committed", {"checkpoint_gc", "eval_dispatch"}),
    ("aerie_verdict_raised", set()),
]


def delivered_to(resources: dict, event: dict, *, custom_bus: bool) -> set[str]:
    """Handlers EventBridge would invoke for `event` put on the Aerie bus or the default bus."""
    handlers: set[str] = set()
    for rule in of_type(resources, "AWS::Events::Rule").values():
        on_custom_bus = "EventBusName" in rule["Properties"]
        if on_custom_bus == custom_bus and matches(rule["Properties"]["EventPattern"], event):
            handlers |= rule_targets(resources, rule)
    return handlers


@pytest.mark.parametrize("event_name, handlers", ROUTED)
def test_aerie_events_reach_the_right_handlers_on_the_aerie_bus(resources, event_name, handlers):
    event = load_event(event_name)
    assert delivered_to(resources, event, custom_bus=True) == handlers
    # Aerie publishes to its own bus only; nothing on the default bus picks its events up.
    assert delivered_to(resources, event, custom_bus=False) == set()


def published_events(tmp_path) -> dict[str, dict]:
    """The events the control plane really publishes, as EventBridge delivers them: written by
    the store's own state changes (SQLite), enveloped as the outbox does (`repo.eventbridge`),
    turned into PutEvents entries (`orchestrator.eventbus.entry`), and rebuilt from the entry's
    fields the way EventBridge builds the event its rules and targets see."""
    from orchestrator.eventbus import entry
    from orchestrator.store import Database, repo

    db = Database(f"sqlite:///{tmp_path / 'aerie.db'}")
    try:
        with db.session() as s:
            job = repo.create_job(s, {"name": "pythia-tiny", "backend": "local"}, "default")
            attempt = repo.create_attempt(s, job, 2, resume_from="s3://b/ckpt/step_00000400")
            repo.set_attempt_state(s, attempt, "Running")
            repo.record_checkpoint(s, attempt, 500, "s3://b/ckpt/step_00000500", {})
            repo.record_verdict(s, attempt, "algo-2", "silent.hang", "no step for 312s", {})
            repo.set_attempt_state(s, attempt, "Failed", {"kind": "silent.hang", "host": "algo-2"}, 143)
            events = [repo.eventbridge(e) for e in repo.list_events(s, job)]
    finally:
        db.dispose()
    out = {}
    for event in events:
        e = entry(event, "aerie")
        delivered = {
            "version": "0",
            "id": "00000000-0000-0000-0000-000000000000",
            "detail-type": e["DetailType"],
            "source": e["Source"],
            "account": "123456789012",
            "time": e["Time"].strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-east-1",
            "resources": e["Resources"],
            "detail": json.loads(e["Detail"]),
        }
        name = {
            "Aerie Attempt State Change": f"aerie_attempt_{str(delivered['detail'].get('state')).lower()}",
            "Aerie Checkpoint Committed": "aerie_checkpoint_committed",
            "Aerie Verdict Raised": "aerie_verdict_raised",
        }.get(e["DetailType"], "other")
        out[name] = delivered
    return out


@pytest.mark.parametrize("event_name, handlers", ROUTED)
def test_what_the_control_plane_publishes_reaches_the_right_handlers(resources, tmp_path, event_name, handlers):
    """Not a fixture file: the events the outbox writes and the publisher sends, against the
    synthesized rules; the sample files above have exactly their fields, so they cannot drift."""
    event = published_events(tmp_path)[event_name]
    assert event["source"] == "aerie.orchestrator" and isinstance(event["detail"]["seq"], int)
    assert delivered_to(resources, event, custom_bus=True) == handlers
    assert delivered_to(resources, event, custom_bus=False) == set()
    assert set(load_event(event_name)["detail"]) == set(event["detail"])


@pytest.mark.parametrize(
    "event_name, handlers",
    [
        ("sagemaker_training_job_failed", {"chain_restart"}),
        ("sagemaker_training_job_stopped", {"chain_restart"}),
        ("sagemaker_training_job_completed", {"chain_restart"}),
        ("sagemaker_training_job_in_progress", set()),
    ],
)
def test_sagemaker_state_changes_reach_chain_restart_on_the_default_bus(resources, event_name, handlers):
    event = load_event(event_name)
    assert delivered_to(resources, event, custom_bus=False) == handlers


def test_rules_retry_and_keep_undeliverable_events(resources):
    for rule in of_type(resources, "AWS::Events::Rule").values():
        for target in rule["Properties"]["Targets"]:
            assert "DeadLetterConfig" in target and target["RetryPolicy"]["MaximumRetryAttempts"] > 0


def test_the_aerie_bus_is_the_one_the_control_plane_may_publish_to(resources):
    (bus_name,) = of_type(resources, "AWS::Events::EventBus")
    for rule in of_type(resources, "AWS::Events::Rule").values():
        if "EventBusName" in rule["Properties"]:
            assert rule["Properties"]["EventBusName"] == {"Ref": bus_name}
    puts = [
        s
        for p in of_type(resources, "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "events:PutEvents" in _as_list(s["Action"])
    ]
    assert puts and all(s["Resource"] == {"Fn::GetAtt": [bus_name, "Arn"]} for s in puts)


# --- Slack ----------------------------------------------------------------------------------------


def test_slack_interactions_route_is_post_only_and_hits_its_handler(resources):
    (route,) = of_type(resources, "AWS::ApiGatewayV2::Route").values()
    assert route["Properties"]["RouteKey"] == "POST /v1/slack/interactions"
    (integration,) = of_type(resources, "AWS::ApiGatewayV2::Integration").values()
    fn_name = integration["Properties"]["IntegrationUri"]["Fn::GetAtt"][0]
    assert resources[fn_name]["Properties"]["Handler"] == "lambdas.slack_interactions.handler"
    secrets = {r["Properties"]["Name"] for r in of_type(resources, "AWS::SecretsManager::Secret").values()}
    assert "aerie/slack-signing-secret" in secrets


# --- checkpoint bucket ----------------------------------------------------------------------------


def test_checkpoint_bucket_is_private_ssl_only_and_aborts_incomplete_uploads(template, resources):
    ((bucket_name, bucket),) = of_type(resources, "AWS::S3::Bucket").items()
    props = bucket["Properties"]
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert props.get("VersioningConfiguration", {}).get("Status") != "Enabled"
    rules = props["LifecycleConfiguration"]["Rules"]
    assert any(
        r.get("AbortIncompleteMultipartUpload") == {"DaysAfterInitiation": 1} and r["Status"] == "Enabled"
        for r in rules
    )
    (policy,) = [
        p
        for p in of_type(resources, "AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": bucket_name}
    ]
    denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in denies)


# --- IAM ------------------------------------------------------------------------------------------

READ_VERBS = ("Get", "List", "Describe", "BatchGet", "BatchCheck", "Head", "Lookup", "Search", "Query", "Scan")


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def is_write_action(action: str) -> bool:
    """Anything not clearly read-only counts as a write: `*`, `s3:*`, `s3:Put*`, `iam:PassRole`..."""
    _service, _, verb = action.partition(":")
    return action == "*" or "*" in verb or not verb.startswith(READ_VERBS)


def all_policy_statements(resources: dict) -> list[tuple[str, dict]]:
    """Every identity-policy statement: AWS::IAM::Policy, ManagedPolicy, and roles' inline Policies."""
    found = []
    for name, r in resources.items():
        if r["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            found += [(name, s) for s in r["Properties"]["PolicyDocument"]["Statement"]]
        elif r["Type"] in ("AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group"):
            for inline in r["Properties"].get("Policies", []):
                found += [(f"{name}/{inline['PolicyName']}", s) for s in inline["PolicyDocument"]["Statement"]]
    return found


def test_no_policy_grants_write_actions_on_every_resource(resources):
    statements = all_policy_statements(resources)
    assert len(statements) > 20, "expected the stack's policies to be found"
    offenders = [
        (where, s["Action"])
        for where, s in statements
        if s["Effect"] == "Allow"
        and "*" in _as_list(s.get("Resource", []))
        and any(is_write_action(a) for a in _as_list(s["Action"]))
    ]
    assert offenders == []


def test_write_action_classifier():
    assert is_write_action("s3:PutObject") and is_write_action("s3:*") and is_write_action("*")
    assert is_write_action("iam:PassRole") and is_write_action("logs:PutLogEvents")
    assert not is_write_action("ecr:GetAuthorizationToken") and not is_write_action("sagemaker:ListTrainingJobs")


def test_sagemaker_role_reads_and_writes_only_the_checkpoint_prefix(synthesized, resources):
    stack = synthesized[0]
    prefix = stack.settings.checkpoint_prefix
    roles = {
        name: r
        for name, r in of_type(resources, "AWS::IAM::Role").items()
        if any(
            s["Principal"].get("Service") == "sagemaker.amazonaws.com"
            for s in r["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        )
    }
    assert len(roles) == 1
    ((role_name, role),) = roles.items()
    assert not role["Properties"].get("ManagedPolicyArns") and not role["Properties"].get("Policies")
    statements = [
        s
        for p in of_type(resources, "AWS::IAM::Policy").values()
        if {"Ref": role_name} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    s3_statements = [s for s in statements if any(a.startswith("s3:") for a in _as_list(s["Action"]))]
    object_statements = [s for s in s3_statements if s["Action"] not in ("s3:ListBucket", "s3:GetBucketLocation")]
    assert object_statements
    for s in object_statements:
        for resource in _as_list(s["Resource"]):
            joined = "".join(part for part in resource["Fn::Join"][1] if isinstance(part, str))
            assert joined == f"/{prefix}*", resource
    (listing,) = [s for s in s3_statements if s["Action"] == "s3:ListBucket"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{prefix}*"]}}
    assert {a for s in object_statements for a in _as_list(s["Action"])} >= {"s3:GetObject", "s3:PutObject"}
    assert not any("s3:DeleteObject" in _as_list(s["Action"]) for s in statements)


def test_control_plane_may_pass_only_the_sagemaker_role(resources):
    passes = [s for _, s in all_policy_statements(resources) if "iam:PassRole" in _as_list(s["Action"])]
    assert passes
    for s in passes:
        assert s["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
        assert "*" not in _as_list(s["Resource"])


# --- control plane --------------------------------------------------------------------------------


def test_database_is_private_encrypted_postgres_with_a_generated_secret(resources):
    (db,) = of_type(resources, "AWS::RDS::DBInstance").values()
    props = db["Properties"]
    assert props["Engine"] == "postgres" and props["StorageEncrypted"] is True
    assert props.get("PubliclyAccessible") is False
    assert "resolve:secretsmanager" in json.dumps(props["MasterUserPassword"])
    (subnets,) = of_type(resources, "AWS::RDS::DBSubnetGroup").values()
    for ref in subnets["Properties"]["SubnetIds"]:
        assert resources[ref["Ref"]]["Properties"]["MapPublicIpOnLaunch"] is False


def test_control_plane_task_gets_database_and_secrets_from_secrets_manager(resources):
    (task,) = of_type(resources, "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    secrets = {s["Name"] for s in container["Secrets"]}
    assert env["AERIE_DATABASE_URL"] == "postgresql+psycopg://" and env["PGSSLMODE"] == "require"
    assert {"PGUSER", "PGPASSWORD", "AERIE_ADMIN_TOKEN", "AERIE_SERVICE_TOKEN", "SLACK_SIGNING_SECRET"} <= secrets
    assert "password" not in json.dumps(container["Environment"]).lower()
    (service,) = of_type(resources, "AWS::ECS::Service").values()
    network = service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"


# --- cfn-lint -------------------------------------------------------------------------------------


def test_cfn_lint_reports_no_errors(synthesized, tmp_path):
    template_file = tmp_path / "Aerie.template.json"
    template_file.write_text(json.dumps(synthesized[2], indent=1))
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run(
        [str(cfn_lint), "--format", "json", str(template_file)], capture_output=True, text=True, timeout=300
    )
    findings = json.loads(result.stdout or "[]")
    errors = [f for f in findings if f["Level"] == "Error"]
    warnings = sorted({f"{f['Rule']['Id']} {f['Message']}" for f in findings if f["Level"] != "Error"})
    print("cfn-lint warnings:", *warnings, sep="\n  ")
    assert errors == [], json.dumps(errors, indent=1)
    assert result.returncode & 2 == 0, result.stderr  # cfn-lint's exit bit for errors


# --- the CLI, as documented -----------------------------------------------------------------------


# Beside the unit tests (`make test`'s first phase): no job, no detector, only CPU; alone in the
# serial phase it cost that phase its own synth (about 45 s) on top of the CLI's.
@pytest.mark.slow
@pytest.mark.side_by_side
def test_documented_cdk_synth_command_produces_the_same_stack(synthesized, tmp_path):
    """Runs `npx aws-cdk@2 synth ...` exactly as README.md's Deploy to AWS section shows, from infra/aws."""
    if shutil.which("npx") is None:
        pytest.skip("Node.js's npx is not installed")
    (argv,) = documented_commands("npx aws-cdk@2 synth")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # python3 -> this venv
    for key in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION", "AWS_PROFILE"):
        env.pop(key, None)
    env.update(AWS_EC2_METADATA_DISABLED="true", CDK_DISABLE_VERSION_CHECK="1")
    outdir = tmp_path / "cdk.out"
    result = subprocess.run(
        ["npx", "--yes", *argv[1:], "--output", str(outdir), "--no-notices", "--quiet"],
        cwd=INFRA,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    if result.returncode != 0 and re.search(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|network", result.stderr):
        pytest.skip(f"npm registry unreachable: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr[-3000:]
    stack = synthesized[0]
    produced = json.loads((outdir / f"{stack.stack_name}.template.json").read_text())
    expected = synthesized[2]
    # The CLI adds only its own version-reporting resource.
    assert sorted(set(produced["Resources"]) - {"CDKMetadata"}) == sorted(expected["Resources"])
    for name, resource in expected["Resources"].items():
        assert produced["Resources"][name]["Type"] == resource["Type"]


# --- settings and the non-default branches ----------------------------------------------------------


def test_context_values_from_the_command_line_are_parsed_and_checked():
    import aws_cdk as cdk

    sys.path.insert(0, str(INFRA))
    from aerie_cdk.settings import Settings

    settings = Settings.from_context(
        cdk.App(context={"aerie:dbMultiAz": "true", "aerie:desiredCount": "2", "aerie:name": "aerie-dev"}).node
    )
    assert settings.db_multi_az is True and settings.desired_count == 2 and settings.name == "aerie-dev"
    for bad in ({"aerie:imageTag": "latest"}, {"aerie:imagetag": "0.2.0"}, {"aerie:checkpointPrefix": "/ckpt"}):
        with pytest.raises(ValueError):
            Settings.from_context(cdk.App(context=bad).node)


OPTIONS = {
    "aerie:certificateArn": "arn:aws:acm:us-east-1:123456789012:certificate/0b1f7c3e-8c3e-4f7a-9a55-2f7d0c4e9a10",
    "aerie:publicUrl": "https://aerie.example.com",
    "aerie:checkpointExpireDays": "30",
    "aerie:retainData": "false",
}


def test_https_expiry_and_throwaway_options_synthesize_cleanly(tmp_path):
    """The branches people switch on with -c: HTTPS listener + redirect, object expiry, no retention."""
    from aws_cdk.assertions import Template

    app_module = _load_app_module()
    _app, stack = app_module.build_app(context={**app_module.cdk_json_context(), **OPTIONS}, outdir=str(tmp_path))
    template = Template.from_stack(stack).to_json()
    resources = template["Resources"]
    listeners = of_type(resources, "AWS::ElasticLoadBalancingV2::Listener").values()
    assert {(lis["Properties"]["Port"], lis["Properties"]["Protocol"]) for lis in listeners} == {
        (443, "HTTPS"),
        (80, "HTTP"),
    }
    (bucket,) = of_type(resources, "AWS::S3::Bucket").values()
    assert bucket["DeletionPolicy"] == "Delete"
    rules = bucket["Properties"]["LifecycleConfiguration"]["Rules"]
    assert {"ExpirationInDays": 30, "Prefix": "checkpoints/", "Status": "Enabled", "Id": "expire-checkpoints"} in rules
    (db,) = of_type(resources, "AWS::RDS::DBInstance").values()
    assert db["Properties"]["DeletionProtection"] is False
    for fn in of_type(resources, "AWS::Lambda::Function").values():
        if fn["Properties"].get("Handler", "").startswith("lambdas."):
            assert fn["Properties"]["Environment"]["Variables"]["AERIE_API"] == OPTIONS["aerie:publicUrl"]
    template_file = tmp_path / "options.template.json"
    template_file.write_text(json.dumps(template))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--format", "json", str(template_file)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert [f for f in json.loads(result.stdout or "[]") if f["Level"] == "Error"] == []
