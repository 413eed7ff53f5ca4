"""A subset of Apache Kafka's command-line tools (`kafka-topics.sh`,
`kafka-acls.sh`), with Kafka's option names and output, over
confluent-kafka's AdminClient.

librdkafka's integration tests shell out to `$KAFKA_PATH/bin/<tool>.sh`
for what its own API does not do in a test (0052, 0077: topics with
configs; 0109, 0115, 0119: ACLs), and Kafka's tools need a JVM and Kafka's
jars, which this machine cannot fetch. These do the same requests through
the Kafka protocol, so what they exercise is the broker's CreateTopics,
CreateAcls and DeleteAcls. Only the options those tests and an operator's
first hour use are here; anything else is refused with a usage error
(exit 1), never ignored.
"""

import argparse
import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

TIMEOUT_S = 30


def admin(bootstrap, command_config):
    conf = {"bootstrap.servers": bootstrap}
    if command_config:
        with open(command_config) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    key, value = line.split("=", 1)
                    conf[key.strip()] = value.strip()
    return AdminClient(conf)


def configs_of(pairs):
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"Invalid config: {pair} (expected key=value)")
        key, value = pair.split("=", 1)
        out[key] = value
    return out


def wait_all(futures):
    """Kafka's tools print each failure and exit 1 if any failed."""
    failed = False
    for name, fut in futures.items():
        try:
            fut.result(timeout=TIMEOUT_S)
        except KafkaException as e:
            print(f"Error while executing on {name}: {e.args[0].str()}", file=sys.stderr)
            failed = True
    return failed


def topic_outcome(future, tolerated):
    """'done', 'tolerated' (the error `--if-exists` / `--if-not-exists`
    accepts) or 'failed' (printed as Kafka's tool prints it)."""
    try:
        future.result(timeout=TIMEOUT_S)
        return "done"
    except KafkaException as e:
        err = e.args[0]
        if tolerated and err.name() == tolerated:
            return "tolerated"
        print(f"Error while executing topic command : {err.str()}", file=sys.stderr)
        return "failed"


def topics(argv):
    p = argparse.ArgumentParser(prog="kafka-topics.sh")
    p.add_argument("--bootstrap-server", required=True)
    p.add_argument("--command-config")
    action = p.add_mutually_exclusive_group(required=True)
    for a in ("create", "delete", "list", "describe", "alter"):
        action.add_argument(f"--{a}", action="store_true")
    p.add_argument("--topic")
    p.add_argument("--partitions", type=int)
    p.add_argument("--replication-factor", type=int)
    p.add_argument("--config", action="append")
    p.add_argument("--if-not-exists", action="store_true")
    p.add_argument("--if-exists", action="store_true")
    args = p.parse_args(argv)
    client = admin(args.bootstrap_server, args.command_config)
    if args.list:
        for name in sorted(client.list_topics(timeout=TIMEOUT_S).topics):
            print(name)
        return 0
    if not args.topic:
        p.error("--topic is required")
    if args.create:
        topic = NewTopic(
            args.topic,
            num_partitions=args.partitions if args.partitions is not None else -1,
            replication_factor=(
                args.replication_factor if args.replication_factor is not None else -1
            ),
            config=configs_of(args.config),
        )
        futures = client.create_topics([topic], request_timeout=TIMEOUT_S)
        outcome = topic_outcome(futures[args.topic], args.if_not_exists and "TOPIC_ALREADY_EXISTS")
        if outcome == "done":
            print(f"Created topic {args.topic}.")
        return 1 if outcome == "failed" else 0
    if args.delete:
        futures = client.delete_topics([args.topic], request_timeout=TIMEOUT_S)
        outcome = topic_outcome(futures[args.topic], args.if_exists and "UNKNOWN_TOPIC_OR_PART")
        return 1 if outcome == "failed" else 0
    if args.alter:
        if args.partitions is None:
            p.error("--alter needs --partitions")
        futures = client.create_partitions(
            [NewPartitions(args.topic, args.partitions)], request_timeout=TIMEOUT_S
        )
        return 1 if wait_all(futures) else 0
    # --describe; a Metadata request naming the topic would auto-create it
    md = client.list_topics(timeout=TIMEOUT_S)
    t = md.topics.get(args.topic)
    if t is None or t.error is not None:
        print(
            f"Error while executing topic command : Topic '{args.topic}' does not exist",
            file=sys.stderr,
        )
        return 1
    rf = len(next(iter(t.partitions.values())).replicas) if t.partitions else 0
    print(f"Topic: {args.topic}\tPartitionCount: {len(t.partitions)}\tReplicationFactor: {rf}")
    for pid in sorted(t.partitions):
        part = t.partitions[pid]
        print(
            f"\tTopic: {args.topic}\tPartition: {pid}\tLeader: {part.leader}\t"
            f"Replicas: {','.join(map(str, part.replicas))}\t"
            f"Isr: {','.join(map(str, part.isrs))}"
        )
    return 0


def operation(name):
    """Kafka's CamelCase operation names (Read, DescribeConfigs, All)."""
    snake = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(name)).upper()
    try:
        return AclOperation[snake]
    except KeyError:
        raise SystemExit(f"Invalid operation: {name}") from None


def acls(argv):
    p = argparse.ArgumentParser(prog="kafka-acls.sh")
    p.add_argument("--bootstrap-server", required=True)
    p.add_argument("--command-config")
    action = p.add_mutually_exclusive_group(required=True)
    for a in ("add", "remove", "list"):
        action.add_argument(f"--{a}", action="store_true")
    p.add_argument("--allow-principal", action="append", default=[])
    p.add_argument("--deny-principal", action="append", default=[])
    p.add_argument("--allow-host", action="append", default=[])
    p.add_argument("--deny-host", action="append", default=[])
    p.add_argument("--operation", action="append", default=[])
    p.add_argument("--topic", action="append", default=[])
    p.add_argument("--group", action="append", default=[])
    p.add_argument("--transactional-id", action="append", default=[])
    p.add_argument("--cluster", action="store_true")
    p.add_argument(
        "--resource-pattern-type",
        default=None,
        choices=["literal", "prefixed", "any", "match"],
    )
    p.add_argument("--force", action="store_true")
    args = p.parse_args(argv)
    client = admin(args.bootstrap_server, args.command_config)

    resources = (
        [(ResourceType.TOPIC, t) for t in args.topic]
        + [(ResourceType.GROUP, g) for g in args.group]
        + [(ResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id]
        + ([(ResourceType.BROKER, "kafka-cluster")] if args.cluster else [])
    )
    pattern_name = args.resource_pattern_type or ("any" if args.list else "literal")
    pattern = ResourcePatternType[pattern_name.upper()]
    if args.add and pattern not in (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED):
        p.error("--add needs a literal or prefixed --resource-pattern-type")
    # Kafka's defaults: a principal with no host means every host.
    entries = [
        (pr, h, AclPermissionType.ALLOW)
        for pr in args.allow_principal
        for h in (args.allow_host or ["*"])
    ] + [
        (pr, h, AclPermissionType.DENY)
        for pr in args.deny_principal
        for h in (args.deny_host or ["*"])
    ]
    ops = [operation(o) for o in args.operation] or [AclOperation.ALL]

    if args.list:
        listed = resources or [(ResourceType.ANY, None)]
        for rtype, name in listed:
            flt = AclBindingFilter(
                rtype, name, pattern, None, None, AclOperation.ANY, AclPermissionType.ANY
            )
            for b in client.describe_acls(flt, request_timeout=TIMEOUT_S).result(
                timeout=TIMEOUT_S
            ):
                print(
                    f"(principal={b.principal}, host={b.host}, operation={b.operation.name}, "
                    f"permissionType={b.permission_type.name}) on "
                    f"{b.restype.name}:{b.resource_pattern_type.name}:{b.name}"
                )
        return 0
    if not resources:
        p.error("a resource is required (--topic, --group, --transactional-id or --cluster)")
    if not entries:
        p.error("--allow-principal or --deny-principal is required")
    if args.add:
        bindings = [
            AclBinding(rtype, name, pattern, pr, host, op, perm)
            for rtype, name in resources
            for pr, host, perm in entries
            for op in ops
        ]
        for rtype, name in resources:
            print(f"Adding ACLs for resource `ResourcePattern(resourceType={rtype.name}, name={name}, patternType={pattern.name})`:")
        return 1 if wait_all(client.create_acls(bindings, request_timeout=TIMEOUT_S)) else 0
    # --remove: Kafka asks for confirmation unless --force.
    if not args.force:
        p.error("--remove without --force would ask for confirmation; pass --force")
    filters = [
        AclBindingFilter(rtype, name, pattern, pr, host, op, perm)
        for rtype, name in resources
        for pr, host, perm in entries
        for op in ops
    ]
    return 1 if wait_all(client.delete_acls(filters, request_timeout=TIMEOUT_S)) else 0


def main():
    tool, argv = sys.argv[1], sys.argv[2:]
    sys.exit({"topics": topics, "acls": acls}[tool](argv))


if __name__ == "__main__":
    main()
