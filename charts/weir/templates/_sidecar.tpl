{{/*
The weir sidecar partials. Usable from this chart (context: the root context)
and from any chart that depends on weir, with a context built from the weir
subchart's values:

  {{- $weir := dict "Values" .Values.weir "Release" .Release "Capabilities" .Capabilities }}

  metadata:
    labels: {{- include "weir.podLabels" $weir | nindent 8 }}
    annotations: {{- include "weir.podAnnotations" $weir | nindent 8 }}
  spec:
    terminationGracePeriodSeconds: {{ include "weir.terminationGracePeriodSeconds" $weir }}
    {{- if include "weir.useNativeSidecar" $weir }}
    initContainers:
      - {{ include "weir.nativeSidecar" $weir | nindent 8 | trim }}
    {{- end }}
    containers:
      - name: app
        ...
      {{- if not (include "weir.useNativeSidecar" $weir) }}
      - {{ include "weir.sidecar" $weir | nindent 8 | trim }}
      {{- end }}
    volumes:
      {{- include "weir.sidecarVolumes" $weir | nindent 6 }}

Each partial renders a YAML mapping (or list) without leading indentation.
*/}}

{{/*
"true" when the sidecar should be a native sidecar (init container with
restartPolicy: Always), "" otherwise. sidecar.native: auto picks it on
Kubernetes >= 1.29, where the SidecarContainers feature is on by default.
*/}}
{{- define "weir.useNativeSidecar" -}}
{{- $native := toString .Values.sidecar.native -}}
{{- if eq $native "true" -}}
true
{{- else if eq $native "auto" -}}
{{- if semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The sidecar as a regular container (goes under spec.containers). */}}
{{- define "weir.sidecar" -}}
{{- include "weir.sidecarContainer" (dict "ctx" . "native" false) -}}
{{- end -}}

{{/* The sidecar as a native sidecar (goes under spec.initContainers, first). */}}
{{- define "weir.nativeSidecar" -}}
{{- include "weir.sidecarContainer" (dict "ctx" . "native" true) -}}
{{- end -}}

{{- define "weir.sidecarContainer" -}}
{{- $ := .ctx -}}
{{- include "weir.validate" $ -}}
{{- $v := $.Values -}}
{{- $sc := $v.sidecar -}}
{{- $public := include "weir.portOf" $v.config.admin.public_listen | int -}}
{{- /*
How a regular sidecar keeps serving while its endpoint removal propagates: the kubelet's
preStop sleep action on Kubernetes >= 1.30, weir's own drain delay (--drain-delay: /ready
fails, the listener stays open) before that. Native sidecars stop after the app and need
neither.
*/}}
{{- $delay := and (not .native) (gt (int $sc.preStopSleepSeconds) 0) -}}
{{- $preStopSleep := and $delay (semverCompare ">=1.30.0-0" $.Capabilities.KubeVersion.Version) -}}
{{- $drainDelay := and $delay (not $preStopSleep) -}}
name: {{ $sc.name }}
image: {{ include "weir.image" $ | quote }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if .native }}
# Native sidecar: starts before the app, stops after it.
restartPolicy: Always
{{- end }}
command:
  - weir
args:
  - run
  - --config
  - {{ include "weir.path.config" $ }}
  {{- if $drainDelay }}
  # No preStop sleep before Kubernetes 1.30: weir delays its own drain.
  - --drain-delay
  - {{ printf "%ds" (int $sc.preStopSleepSeconds) }}
  {{- end }}
env:
  - name: RUST_LOG
    value: {{ $sc.logLevel | quote }}
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
{{- with $sc.extraEnv }}
  {{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - name: weir-inbound
    containerPort: {{ include "weir.portOf" $v.config.inbound.listen }}
    protocol: TCP
  - name: weir-metrics
    containerPort: {{ $public }}
    protocol: TCP
# Probes use the public listener: the admin API stays on loopback.
startupProbe:
  httpGet:
    path: /live
    port: {{ $public }}
  periodSeconds: {{ $sc.probes.startup.periodSeconds }}
  failureThreshold: {{ $sc.probes.startup.failureThreshold }}
livenessProbe:
  httpGet:
    path: /live
    port: {{ $public }}
  periodSeconds: {{ $sc.probes.liveness.periodSeconds }}
  timeoutSeconds: {{ $sc.probes.liveness.timeoutSeconds }}
  failureThreshold: {{ $sc.probes.liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: /ready
    port: {{ $public }}
  periodSeconds: {{ $sc.probes.readiness.periodSeconds }}
  timeoutSeconds: {{ $sc.probes.readiness.timeoutSeconds }}
  failureThreshold: {{ $sc.probes.readiness.failureThreshold }}
{{- /*
A regular sidecar gets SIGTERM together with the app; the preStop sleep keeps
weir serving while the endpoint removal propagates. weir then drains for
inbound.shutdown_grace. A native sidecar is stopped after the app exits.
*/}}
{{- if $preStopSleep }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ $sc.preStopSleepSeconds }}
{{- end }}
{{- with $sc.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ $sc.runAsUser }}
  runAsGroup: {{ $sc.runAsGroup }}
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities:
    drop:
      - ALL
  seccompProfile:
    type: RuntimeDefault
terminationMessagePolicy: FallbackToLogsOnError
volumeMounts:
  - name: weir-config
    mountPath: {{ include "weir.path.config" $ }}
    subPath: config.yaml
    readOnly: true
  # A directory mount (no subPath) so ConfigMap updates arrive via the
  # kubelet's ..data symlink swap and weir hot-reloads the table.
  - name: weir-table
    mountPath: {{ include "weir.path.tableDir" $ }}
    readOnly: true
  - name: weir-token
    mountPath: {{ include "weir.path.tokenDir" $ }}
    readOnly: true
  - name: weir-user-secret
    mountPath: {{ include "weir.path.userSecretDir" $ }}
    readOnly: true
  {{- if $v.persistTable }}
  - name: weir-state
    mountPath: {{ include "weir.path.stateDir" $ }}
  {{- end }}
{{- end -}}

{{/* Pod volumes the sidecar mounts (a list; goes under spec.volumes). */}}
{{- define "weir.sidecarVolumes" -}}
- name: weir-config
  configMap:
    name: {{ include "weir.configMapName" . }}
- name: weir-table
  configMap:
    name: {{ include "weir.tableConfigMapName" . }}
- name: weir-token
  secret:
    secretName: {{ include "weir.tokenSecretName" . }}
    # 0444: readable by the non-root sidecar user; only the sidecar mounts it.
    defaultMode: 292
    items:
      - key: {{ .Values.controlToken.key }}
        path: token
- name: weir-user-secret
  secret:
    secretName: {{ include "weir.userSecretName" . }}
    defaultMode: 292
    items:
      - key: {{ .Values.userSecret.key }}
        path: secret
{{- if .Values.persistTable }}
- name: weir-state
  emptyDir:
    sizeLimit: 16Mi
{{- end }}
{{- end -}}

{{/*
Pod labels for pods running the sidecar: the PodMonitor and the NetworkPolicy select on
weir.dev/sidecar; entries (config.inbound.entry) carry weir.dev/entry, which the
NetworkPolicy leaves open to callers outside the mesh.
*/}}
{{- define "weir.podLabels" -}}
weir.dev/sidecar: weir
{{- if .Values.config.inbound.entry }}
weir.dev/entry: "true"
{{- end }}
{{- end -}}

{{/*
Pod annotations: a checksum of the sidecar config so a config change rolls
the pods. The table is deliberately left out: it hot-reloads.
*/}}
{{- define "weir.podAnnotations" -}}
checksum/weir-config: {{ include "weir.configYaml" . | sha256sum }}
{{- end -}}

{{/* terminationGracePeriodSeconds for pods running the sidecar. */}}
{{- define "weir.terminationGracePeriodSeconds" -}}
{{- .Values.sidecar.terminationGracePeriodSeconds -}}
{{- end -}}
