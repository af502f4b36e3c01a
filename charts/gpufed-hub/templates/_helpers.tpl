{{/*
Names are fixed, not derived from the release name: the hub's code, its RBAC and the agents
name them (gpufed-hub, gpufed-system). One hub installation per hub cluster.
*/}}
{{- define "gpufed.name" -}}gpufed-hub{{- end -}}

{{/* The chart installs into gpufed-system only (the hub's --token-namespace and the system
namespaces it refuses jobs in name it). */}}
{{- define "gpufed.namespace" -}}
{{- if ne .Release.Namespace "gpufed-system" -}}
{{- fail (printf "gpufed-hub installs into namespace gpufed-system, not %q: the hub's join-token namespace and the namespaces it refuses jobs in name it (docs/hub.md); run helm install with --namespace gpufed-system --create-namespace" .Release.Namespace) -}}
{{- end -}}
gpufed-system
{{- end -}}

{{/* Labels of every object: the kustomize base's two, plus Helm's standard ones. */}}
{{- define "gpufed.labels" -}}
app.kubernetes.io/name: {{ include "gpufed.name" . }}
app.kubernetes.io/part-of: gpufed
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The selector: as in manifests/ (a Deployment's selector is immutable, so kustomize and
Helm installs can replace each other). */}}
{{- define "gpufed.selector" -}}
app.kubernetes.io/name: {{ include "gpufed.name" . }}
{{- end -}}

{{/* registry/repository:tag, tag defaulting to the chart's appVersion. */}}
{{- define "gpufed.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" (include "gpufed.repository" .) .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" (include "gpufed.repository" .) $tag -}}
{{- end -}}
{{- end -}}

{{- define "gpufed.repository" -}}
{{- if .Values.image.registry -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.image.registry) .Values.image.repository -}}
{{- else -}}
{{- .Values.image.repository -}}
{{- end -}}
{{- end -}}

{{/* NetworkPolicy peers: none given means from anywhere (the rule has no "from"). */}}
{{- define "gpufed.peers" -}}
{{- if . }}
      from:
{{ toYaml . | indent 8 }}
{{- end }}
{{- end -}}

{{/* The queue flags, one "- --flag=value" line each, only where a value differs from the hub's
default (so the default install renders the kustomize base); a bad value fails naming it. */}}
{{- define "gpufed.queueArgs" -}}
{{- $q := .Values.queues -}}
{{- if not (has $q.unlistedNamespaces (list "default-queue" "reject")) -}}
{{- fail (printf "queues.unlistedNamespaces is %q: use default-queue (jobs of namespaces no GPUQueue lists go to the default queue) or reject (they wait until a GPUQueue lists the namespace)" (toString $q.unlistedNamespaces)) -}}
{{- end -}}
{{- if eq $q.unlistedNamespaces "reject" }}
- --unlisted-namespaces=reject
{{- end -}}
{{- $cap := $q.defaultQueueMaxPriority -}}
{{- if and (not (kindIs "invalid" $cap)) (ne (toString $cap) "") -}}
{{- $n := int64 $cap -}}
{{- $whole := true -}}
{{- if kindIs "float64" $cap -}}
{{- $whole = eq (float64 $n) $cap -}}
{{- else if kindIs "string" $cap -}}
{{- $whole = eq (toString $n) $cap -}}
{{- end -}}
{{- if or (not $whole) (gt $n 2147483647) (lt $n -2147483648) -}}
{{- fail (printf "queues.defaultQueueMaxPriority is %s: give an integer from -2147483648 to 2147483647 (an int32, as a PriorityClass value), or \"\" for no cap" (ternary (toString $n) (toString $cap) $whole)) -}}
{{- end }}
- --default-queue-max-priority={{ $n }}
{{- end -}}
{{- $hps := $q.holdsPerShape -}}
{{- if and (not (kindIs "invalid" $hps)) (ne (toString $hps) "") -}}
{{- $n := int64 $hps -}}
{{- $whole := true -}}
{{- if kindIs "float64" $hps -}}
{{- $whole = eq (float64 $n) $hps -}}
{{- else if kindIs "string" $hps -}}
{{- $whole = eq (toString $n) $hps -}}
{{- end -}}
{{- if or (not $whole) (lt $n 1) (gt $n 64) -}}
{{- fail (printf "queues.holdsPerShape is %s: give an integer from 1 to 64 (starving jobs of one shape that hold different nodes in one pass), or \"\" for the hub's default (4)" (toString $hps)) -}}
{{- end }}
- --queue-holds-per-shape={{ $n }}
{{- end -}}
{{- $age := $q.sizeAgingSeconds -}}
{{- if and (not (kindIs "invalid" $age)) (ne (toString $age) "") -}}
{{- if or (and (kindIs "string" $age) (not (regexMatch "^[0-9]+([.][0-9]+)?$" $age))) (lt (float64 $age) 0.0) -}}
{{- fail (printf "queues.sizeAgingSeconds is %s: give a number of seconds >= 0 (0: sizes do not age), or \"\" for the hub's default (1800)" (toString $age)) -}}
{{- end }}
- --queue-size-aging={{ $age }}
{{- end -}}
{{- end -}}

{{/*
The --managed-kinds argument (only when some kind is given: the hub's default is none), after
checking every kind.
*/}}
{{- define "gpufed.managedKinds" -}}
{{- $kinds := .Values.managedKinds | default list -}}
{{- range $kinds -}}
{{- if not (has . (list "Job" "JobSet")) -}}
{{- fail (printf "managedKinds: %q is not Job or JobSet (the kinds the hub federates with spec.managedBy gpufed.io/hub)" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- $joined := join "," (sortAlpha $kinds) -}}
{{- if $joined }}
- --managed-kinds={{ $joined }}
{{- end -}}
{{- end -}}
