# Snapflow image: the official Apache Spark image (Spark, Java, Python) plus Snapflow.
# One image for every role in docker-compose.yml: coordinator, Spark master and workers, and the
# job submitter.
#
# The Spark version must equal the pyspark version the project is tested with
# (tests/project/test_compose.py checks both the FROM tag and the pyspark pin below).
FROM apache/spark:4.3.0-python3

USER root

# Snapflow needs Python >= 3.11. The Spark image ships Ubuntu's python3, which is older on some
# releases (Ubuntu 22.04 has 3.10): then python3.11 comes from Ubuntu's archive. The venv module
# is a separate package on Ubuntu. Everything goes into a virtualenv, which is also the Python of
# the PySpark workers (PYSPARK_PYTHON).
RUN set -eux; \
    minor="$(python3 -c 'import sys; print(sys.version_info.minor)')"; \
    if [ "$minor" -lt 11 ]; then minor=11; fi; \
    apt-get update; \
    apt-get install -y --no-install-recommends "python3.${minor}" "python3.${minor}-venv"; \
    rm -rf /var/lib/apt/lists/*; \
    "python3.${minor}" -m venv /opt/snapflow/venv; \
    /opt/snapflow/venv/bin/python -m pip install --no-cache-dir --upgrade pip

ENV PATH=/opt/snapflow/venv/bin:$PATH \
    PYSPARK_PYTHON=/opt/snapflow/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/snapflow/venv/bin/python \
    PYTHONUNBUFFERED=1

WORKDIR /opt/snapflow/src

# Dependencies first (a layer that survives source changes), pyspark pinned to the image's Spark.
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
RUN pip install --no-cache-dir ".[s3]" "pyspark==4.3.0"

COPY docker/healthcheck.py /opt/snapflow/healthcheck.py

# Checkpoint storage: a named volume mounted at /data starts with this owner (spark, uid 185).
RUN mkdir -p /data/checkpoints && chown -R spark:spark /data

USER spark
WORKDIR /opt/spark/work-dir

# 50051: coordinator gRPC; 9464: coordinator Prometheus /metrics.
EXPOSE 50051 9464

CMD ["snapflow", "coordinator", "--host", "0.0.0.0"]
