{{/* Names: fullnameOverride, else <release>-lazykv (the release name when it already says
lazykv). At most 44 characters, so that "<name>-kvstore" and "<name>-worker" fit a
StatefulSet's 52; a longer one fails rather than being cut (two releases would share
names, and an upgrade would rename the StatefulSets and orphan their volumes). */}}
{{- define "lazykv.fullname" -}}
{{- $name := .Values.fullnameOverride | default (ternary .Release.Name (printf "%s-%s" .Release.Name .Chart.Name) (contains .Chart.Name .Release.Name)) -}}
{{- if gt (len $name) 44 -}}
{{- fail (printf "the name %q has %d characters, at most 44 fit: set fullnameOverride or use a shorter release name" $name (len $name)) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* A value as a flag takes it: whole numbers without an exponent (YAML reads 2097152 as a float). */}}
{{- define "lazykv.number" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{- define "lazykv.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "worker"),
     with "group" G for one distributed replica's pods when there are several. */}}
{{- define "lazykv.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if and (hasKey . "group") (include "lazykv.replicatedGroups" .root) }}
lazykv.dev/group: {{ .group | toString | quote }}
{{- end }}
{{- end -}}

{{/* "true" when distributed replicas run behind the router, each its own
     coordinator and worker ranks. */}}
{{- define "lazykv.replicatedGroups" -}}
{{- if and (eq .Values.mode "distributed") .Values.router.enabled }}true{{ end -}}
{{- end -}}

{{/* How many coordinator groups: coordinator.replicas behind the router, else 1. */}}
{{- define "lazykv.groups" -}}
{{- ternary (int .Values.coordinator.replicas) 1 (eq (include "lazykv.replicatedGroups" .) "true") -}}
{{- end -}}

{{/* One group's object name: <name>-<component>, or <name>-<component>-G
     behind the router: (dict "root" $ "component" "worker" "group" G). */}}
{{- define "lazykv.groupName" -}}
{{- $base := printf "%s-%s" (include "lazykv.fullname" .root) .component -}}
{{- if include "lazykv.replicatedGroups" .root }}{{ printf "%s-%d" $base (int .group) }}{{ else }}{{ $base }}{{ end -}}
{{- end -}}

{{- define "lazykv.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Values that cannot work fail the install here, saying why. */}}
{{- define "lazykv.validate" -}}
{{- if not (has .Values.mode (list "serve" "distributed")) -}}
{{- fail (printf "mode must be serve or distributed, not %q" (toString .Values.mode)) -}}
{{- end -}}
{{- $tp := .Values.worker.tensorParallel -}}
{{- $world := $tp.world -}}
{{- if not (or (kindIs "float64" $world) (kindIs "int64" $world) (kindIs "int" $world)) -}}
{{- fail (printf "worker.tensorParallel.world must be a whole number >= 1, not %v" $world) -}}
{{- else if or (lt (float64 $world) 1.0) (ne (float64 $world) (float64 (int $world))) -}}
{{- fail (printf "worker.tensorParallel.world must be a whole number >= 1, not %v" $world) -}}
{{- end -}}
{{- if not (has $tp.collective (list "gloo" "nccl")) -}}
{{- fail (printf "worker.tensorParallel.collective must be gloo or nccl, not %q" (toString $tp.collective)) -}}
{{- end -}}
{{- if and (eq $tp.collective "nccl") (lt (int .Values.worker.gpusPerRank) 1) -}}
{{- fail "worker.tensorParallel.collective nccl needs a GPU per rank: set worker.gpusPerRank to 1" -}}
{{- end -}}
{{- if and (eq .Values.mode "serve") (gt (int $tp.world) 1) -}}
{{- fail "worker.tensorParallel.world > 1 needs mode: distributed (serve runs one process)" -}}
{{- end -}}
{{- $replicas := .Values.coordinator.replicas -}}
{{- if or (not (or (kindIs "float64" $replicas) (kindIs "int64" $replicas) (kindIs "int" $replicas))) (lt (float64 $replicas) 1.0) (ne (float64 $replicas) (float64 (int $replicas))) -}}
{{- fail (printf "coordinator.replicas must be a whole number >= 1, not %v" $replicas) -}}
{{- end -}}
{{- if and (gt (int $replicas) 1) (not (and (eq .Values.mode "distributed") .Values.router.enabled)) -}}
{{- fail "coordinator.replicas > 1 needs mode: distributed and router.enabled (the router spreads requests over them)" -}}
{{- end -}}
{{- if include "lazykv.replicatedGroups" . -}}
{{- $longest := include "lazykv.groupName" (dict "root" . "component" "worker" "group" (sub (int $replicas) 1)) -}}
{{- if gt (len $longest) 52 -}}
{{- fail (printf "the StatefulSet name %q has %d characters, at most 52 fit: set a shorter fullnameOverride" $longest (len $longest)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.prefixCacheTiers (not (and .Values.kvstore.enabled (gt (float64 .Values.prefixCacheMiB) 0.0))) -}}
{{- fail "prefixCacheTiers needs a prefix cache (prefixCacheMiB > 0) and the kvstore (kvstore.enabled)" -}}
{{- end -}}
{{- if and (ne (toString .Values.model) "default") (not .Values.modelVolume) -}}
{{- fail (printf "model %q is a path: mount the volume that holds it with modelVolume (at /models)" (toString .Values.model)) -}}
{{- end -}}
{{- $managed := list "LAZYKV_HOST" "LAZYKV_MODEL" "LAZYKV_PORT" "LAZYKV_GRPC_PORT" "LAZYKV_DRAIN_SECONDS" "LAZYKV_API_KEY"
    "LAZYKV_THREADS" "LAZYKV_KVSTORE" "LAZYKV_CONNECT_TIMEOUT" "LAZYKV_RANK" "LAZYKV_WORLD" "LAZYKV_COLLECTIVE"
    "LAZYKV_TP_HOST" "LAZYKV_LISTEN" "LAZYKV_DATA_PORT" "LAZYKV_METRICS_PORT" "LAZYKV_HOST_CAPACITY_MIB"
    "LAZYKV_NVME_PATH" "LAZYKV_NVME_CAPACITY_MIB" "LAZYKV_TRANSPORTS" "LAZYKV_KVSTORE_TRANSPORTS" "LAZYKV_PREFIX_CACHE_MIB"
    "LAZYKV_PREFIX_CACHE_TIERS" -}}
{{- range $name, $_ := .Values.extraEnv -}}
{{- if or (has $name $managed) (hasPrefix "LAZYKV_KV_" $name) -}}
{{- fail (printf "extraEnv.%s: the chart sets it from its own value (kvPolicy, kvCacheMiB, prefixCacheMiB, prefixCacheTiers, threads, api, worker, kvstore)" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Prompt KV reuse for containers that hold a KV cache (serve, worker ranks). */}}
{{- define "lazykv.prefixCacheEnv" -}}
- name: LAZYKV_PREFIX_CACHE_MIB
  value: {{ include "lazykv.number" .Values.prefixCacheMiB | quote }}
{{- if .Values.prefixCacheTiers }}
- name: LAZYKV_PREFIX_CACHE_TIERS
  value: "true"
{{- end }}
{{- end -}}

{{/* The model (and its volume) for containers that load it. */}}
{{- define "lazykv.modelEnv" -}}
- name: LAZYKV_MODEL
  value: {{ .Values.model | toString | quote }}
{{- end -}}

{{- define "lazykv.modelVolumeMount" -}}
{{- if .Values.modelVolume }}
volumeMounts:
  - name: models
    mountPath: /models
    readOnly: true
{{- end }}
{{- end -}}

{{- define "lazykv.modelVolume" -}}
{{- if .Values.modelVolume }}
volumes:
  - name: models
    {{- toYaml .Values.modelVolume | nindent 4 }}
{{- end }}
{{- end -}}

{{/* The server's default KV policy: LAZYKV_KV_POLICY and LAZYKV_KV_<PARAM>. */}}
{{- define "lazykv.policyEnv" -}}
- name: LAZYKV_KV_POLICY
  value: {{ .Values.kvPolicy.name | quote }}
{{- range $param, $value := .Values.kvPolicy.params }}
- name: {{ printf "LAZYKV_KV_%s" (upper $param) }}
  value: {{ include "lazykv.number" $value | quote }}
{{- end }}
{{- end -}}

{{/* The API of serve or the coordinator. */}}
{{- define "lazykv.apiEnv" -}}
- name: LAZYKV_PORT
  value: {{ include "lazykv.number" .Values.api.port | quote }}
- name: LAZYKV_GRPC_PORT
  value: {{ include "lazykv.number" .Values.api.grpcPort | quote }}
- name: LAZYKV_DRAIN_SECONDS
  value: {{ include "lazykv.number" .Values.api.drainSeconds | quote }}
{{- if .Values.api.apiKeySecret }}
- name: LAZYKV_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.api.apiKeySecret }}
      key: api-key
{{- end }}
{{- end -}}

{{/* LAZYKV_THREADS of a container that runs the model: (dict "root" $ "container" NAME "resources" R).
With threads 0 and a CPU limit, the limit (rounded up to whole cores): the process would otherwise count the node's cores. */}}
{{- define "lazykv.threadsEnv" -}}
- name: LAZYKV_THREADS
{{- if and (eq (int64 .root.Values.threads) 0) (dig "limits" "cpu" "" (.resources | default dict)) }}
  valueFrom:
    resourceFieldRef:
      containerName: {{ .container }}
      resource: limits.cpu
{{- else }}
  value: {{ include "lazykv.number" .root.Values.threads | quote }}
{{- end }}
{{- end -}}

{{- define "lazykv.extraEnv" -}}
{{- range $name, $value := .Values.extraEnv }}
- name: {{ $name }}
  value: {{ include "lazykv.number" $value | quote }}
{{- end }}
{{- end -}}

{{/* HOST:PORT of the kvstore's control plane, for serve or the workers. */}}
{{- define "lazykv.kvstoreAddress" -}}
{{ include "lazykv.fullname" . }}-kvstore:{{ .Values.kvstore.port }}
{{- end -}}

{{/* Ports, probes and annotations of the pod that serves the API. */}}
{{- define "lazykv.apiPorts" -}}
ports:
  - name: http
    containerPort: {{ .Values.api.port }}
{{- if ge (int .Values.api.grpcPort) 0 }}
  - name: grpc
    containerPort: {{ .Values.api.grpcPort }}
{{- end }}
readinessProbe:
  httpGet:
    path: /ready
    port: http
  periodSeconds: 5
livenessProbe:
  httpGet:
    path: /health
    port: http
  periodSeconds: 10
  failureThreshold: 6
startupProbe:
  httpGet:
    path: /health
    port: http
  periodSeconds: 5
  failureThreshold: 120
{{- end -}}

{{/* The component the API Service selects: the router when there is one. */}}
{{- define "lazykv.apiComponent" -}}
{{- ternary "router" "api" .Values.router.enabled -}}
{{- end -}}

{{- define "lazykv.scrapeAnnotations" -}}
{{- if .root.Values.metrics.scrapeAnnotations }}
annotations:
  prometheus.io/scrape: "true"
  prometheus.io/port: {{ include "lazykv.number" .port | quote }}
  prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{- define "lazykv.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
