# Snapflow image: the official slim Python image (Debian bookworm), a Java runtime from Debian, and
# Spark from the pinned pyspark wheel, which ships Spark's jars and launch scripts (spark-class,
# spark-submit): no Spark image is needed. One image for every role in docker-compose.yml:
# coordinator, Spark master and workers, and the job submitter.
#
# tests/project/test_compose.py checks the base, the JRE and that the pyspark pin equals the
# pyspark version the project is tested with.
FROM python:3.11-slim-bookworm

# Spark 4 runs on Java 17 or 21; bookworm's JRE is 17. procps: Spark's scripts call ps.
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless procps; \
    rm -rf /var/lib/apt/lists/*; \
    java -version

# Everything goes into a virtualenv, which is also the Python of the PySpark workers.
RUN python -m venv /opt/snapflow/venv && /opt/snapflow/venv/bin/python -m pip install --no-cache-dir --upgrade pip

ENV PATH=/opt/snapflow/venv/bin:$PATH \
    PYSPARK_PYTHON=/opt/snapflow/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/snapflow/venv/bin/python \
    SPARK_WORKER_DIR=/opt/spark/work \
    PYTHONUNBUFFERED=1

WORKDIR /opt/snapflow/src

# Dependencies first (a layer that survives source changes), with pyspark pinned.
COPY pyproject.toml README.md ./
RUN set -eux; \
    python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt; \
    pip install --no-cache-dir -r /tmp/requirements.txt "pyspark==4.3.0"; \
    rm /tmp/requirements.txt

# The project itself.
# snapflow/ holds the foundation and symbolic links to the layer folders copied next to it.
COPY snapflow ./snapflow
COPY coordinator ./coordinator
COPY worker ./worker
COPY spark_bridge ./spark_bridge
COPY cli ./cli
RUN pip install --no-cache-dir ".[s3,kafka]" "pyspark==4.3.0"

COPY docker/healthcheck.py /opt/snapflow/healthcheck.py

# An unprivileged user (uid 185, as in the Spark images) owning the checkpoint volume's mount
# point (a named volume mounted at /data starts with this owner) and Spark's work directories.
RUN set -eux; \
    useradd --system --uid 185 --create-home --home-dir /opt/spark spark; \
    mkdir -p /data/checkpoints /opt/spark/work /opt/spark/work-dir; \
    chown -R spark:spark /data /opt/spark

USER spark
WORKDIR /opt/spark/work-dir

# 50051: coordinator gRPC; 9464: coordinator Prometheus /metrics.
EXPOSE 50051 9464

CMD ["snapflow", "coordinator", "--host", "0.0.0.0"]
