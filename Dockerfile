# syntax=docker/dockerfile:1
# One image for the hub and the member agent: the entrypoint is `gpufed`, so the same image
# runs `gpufed hub ...` (manifests/hub) and `gpufed agent ...` (manifests/agent).
# Build: docker build -t gpufed:0.1.0 .

FROM python:3.11-slim AS build
WORKDIR /src
# Dependencies first (from pyproject.toml), so source edits do not invalidate that layer.
COPY pyproject.toml README.md ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
 && python -m venv /opt/gpufed \
 && /opt/gpufed/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY api/ api/
COPY placement/ placement/
COPY sync/ sync/
COPY hub/ hub/
COPY member-agent/ member-agent/
COPY sandbox/ sandbox/
COPY cli/ cli/
RUN /opt/gpufed/bin/pip install --no-cache-dir --no-deps . \
 && /opt/gpufed/bin/gpufed --help > /dev/null

FROM python:3.11-slim
COPY --from=build /opt/gpufed /opt/gpufed
ENV PATH=/opt/gpufed/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Non-root (matches runAsUser in manifests/agent and manifests/hub).
USER 65532:65532
ENTRYPOINT ["gpufed"]
CMD ["--help"]
