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
{{- with $q.defaultQueue -}}
{{- if not (and (kindIs "string" .) (le (len .) 63) (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" .)) -}}
{{- fail (printf "queues.defaultQueue is %q: give a GPUQueue name (lowercase letters, digits, '-' and '.', at most 63 characters, starting and ending with a letter or digit), or \"\" for the hub's default (default)" (toString .)) -}}
{{- end }}
- --default-queue={{ . }}
{{- end -}}
{{- include "gpufed.secondsArg" (dict "name" "queues.fairShareHalfLifeSeconds" "value" $q.fairShareHalfLifeSeconds "flag" "--fair-share-half-life" "positive" true "max" 315360000 "what" "ten years; the half-life of the decayed GPU-seconds that order queues" "default" "86400") -}}
{{- with $q.order -}}
{{- if not (has . (list "smallest-first" "fifo")) -}}
{{- fail (printf "queues.order is %q: use smallest-first (fewer GPUs first, within a queue and priority) or fifo (arrival order), or \"\" for the hub's default (smallest-first)" (toString .)) -}}
{{- end }}
- --queue-order={{ . }}
{{- end -}}
{{- include "gpufed.secondsArg" (dict "name" "queues.oldestFirstSeconds" "value" $q.oldestFirstSeconds "flag" "--queue-oldest-first" "positive" false "max" 31536000 "what" "a year; a job waiting this long goes ahead of every younger job of its queue and priority" "default" "57600") -}}
{{- include "gpufed.secondsArg" (dict "name" "queues.starvationSeconds" "value" $q.starvationSeconds "flag" "--queue-starvation" "positive" false "max" 31536000 "what" "a year; a job waiting this long without fitting holds the nodes it needs" "default" "1800") -}}
{{- include "gpufed.intArg" (dict "name" "queues.maxHolds" "value" $q.maxHolds "flag" "--queue-max-holds" "min" 0 "max" 1000 "what" "waiting jobs that hold nodes at once; 0: no holds" "default" "4") -}}
{{- include "gpufed.intArg" (dict "name" "queues.holdsPerShape" "value" $q.holdsPerShape "flag" "--queue-holds-per-shape" "min" 1 "max" 64 "what" "starving jobs of one shape that hold different nodes in one pass" "default" "4") -}}
{{- include "gpufed.secondsArg" (dict "name" "queues.sizeAgingSeconds" "value" $q.sizeAgingSeconds "flag" "--queue-size-aging" "positive" false "max" 31536000 "what" "a year; 0: sizes do not age" "default" "1800") -}}
{{- $carry := $q.carryHolds -}}
{{- if and (not (kindIs "invalid" $carry)) (ne (toString $carry) "") -}}
{{- if not (kindIs "bool" $carry) -}}
{{- fail (printf "queues.carryHolds is %q: give true or false (the last pass's holds also keep younger jobs off their nodes), or \"\" for the hub's default (false)" (toString $carry)) -}}
{{- end }}
- --{{ ternary "" "no-" $carry }}queue-carry-holds
{{- end -}}
{{- include "gpufed.secondsArg" (dict "name" "queues.spareWholeNodesSeconds" "value" $q.spareWholeNodesSeconds "flag" "--queue-spare-whole-nodes" "positive" false "max" 31536000 "what" "a year; seconds a job smaller than a node gives up whole free nodes; 0: off" "default" "5400") -}}
{{- end -}}

{{/* "- FLAG=N" for an integer value (a dict: name, value, flag, min, max, what, default), nothing
for "" (the hub's default); anything but a whole number from min to max fails naming the value. */}}
{{- define "gpufed.intArg" -}}
{{- $v := .value -}}
{{- if and (not (kindIs "invalid" $v)) (ne (toString $v) "") -}}
{{- $n := int64 $v -}}
{{- $whole := not (kindIs "bool" $v) -}}
{{- if kindIs "float64" $v -}}
{{- $whole = eq (float64 $n) $v -}}
{{- else if kindIs "string" $v -}}
{{- $whole = eq (toString $n) $v -}}
{{- end -}}
{{- if or (not $whole) (lt $n (int64 .min)) (gt $n (int64 .max)) -}}
{{- fail (printf "%s is %s: give an integer from %d to %d (%s), or \"\" for the hub's default (%s)" .name (toString $v) (int64 .min) (int64 .max) .what .default) -}}
{{- end }}
- {{ .flag }}={{ $n }}
{{- end -}}
{{- end -}}

{{/* "- FLAG=S" for a number of seconds (a dict: name, value, flag, positive (> 0 rather than
>= 0), max, what, default), nothing for "" (the hub's default); anything else fails naming it. */}}
{{- define "gpufed.secondsArg" -}}
{{- $v := .value -}}
{{- if and (not (kindIs "invalid" $v)) (ne (toString $v) "") -}}
{{- $ok := not (kindIs "bool" $v) -}}
{{- if kindIs "string" $v -}}
{{- $ok = regexMatch "^[0-9]+([.][0-9]+)?$" $v -}}
{{- end -}}
{{- $low := ternary (le (float64 $v) 0.0) (lt (float64 $v) 0.0) .positive -}}
{{- if or (not $ok) $low (gt (float64 $v) (float64 .max)) -}}
{{- fail (printf "%s is %s: give a number of seconds %s 0, at most %d (%s), or \"\" for the hub's default (%s)" .name (toString $v) (ternary ">" ">=" .positive) (int64 .max) .what .default) -}}
{{- end }}
- {{ .flag }}={{ $v }}
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
