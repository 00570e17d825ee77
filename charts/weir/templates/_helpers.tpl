{{/*
Names and labels. These helpers read only .Values and .Release so the sidecar
partials can call them from another chart with a small context:
  (dict "Values" .Values.weir "Release" .Release "Capabilities" .Capabilities)
*/}}

{{- define "weir.name" -}}
{{- default "weir" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* 52 characters leave room for "-injector" within a 63-character Service name. */}}
{{- define "weir.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "weir.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "weir.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "weir.labels" -}}
helm.sh/chart: {{ include "weir.chart" . }}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: weir
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "weir.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* Resource names shared by the chart and the partials. */}}
{{- define "weir.configMapName" -}}{{ include "weir.fullname" . }}-config{{- end -}}
{{- define "weir.tableConfigMapName" -}}{{ include "weir.fullname" . }}-table{{- end -}}
{{- define "weir.tokenSecretName" -}}
{{- .Values.controlToken.existingSecret | default (printf "%s-token" (include "weir.fullname" .)) -}}
{{- end -}}
{{- define "weir.userSecretName" -}}
{{- .Values.userSecret.existingSecret | default (printf "%s-user-secret" (include "weir.fullname" .)) -}}
{{- end -}}

{{/*
Where the sidecar finds its files. Fixed here (not values) so the config file
and the volume mounts can never disagree.
*/}}
{{- define "weir.path.configDir" -}}/etc/weir{{- end -}}
{{- define "weir.path.config" -}}/etc/weir/config.yaml{{- end -}}
{{- define "weir.path.tableDir" -}}/etc/weir/table{{- end -}}
{{- define "weir.path.table" -}}/etc/weir/table/table.yaml{{- end -}}
{{- define "weir.path.tokenDir" -}}/var/run/secrets/weir/token{{- end -}}
{{- define "weir.path.token" -}}/var/run/secrets/weir/token/token{{- end -}}
{{- define "weir.path.userSecretDir" -}}/var/run/secrets/weir/user{{- end -}}
{{- define "weir.path.userSecret" -}}/var/run/secrets/weir/user/secret{{- end -}}
{{- define "weir.path.stateDir" -}}/var/run/weir{{- end -}}
{{- define "weir.path.state" -}}/var/run/weir/table.yaml{{- end -}}

{{/* Port of a "host:port" / "[v6]:port" listen address. */}}
{{- define "weir.portOf" -}}
{{- regexFind "[0-9]+$" . -}}
{{- end -}}

{{/*
The sidecar config file: .Values.config plus the file paths the chart mounts.
*/}}
{{- define "weir.configYaml" -}}
{{- $config := deepCopy .Values.config -}}
{{- $admin := $config.admin -}}
{{- $_ := set $admin "token_file" (include "weir.path.token" .) -}}
{{- $_ = set $admin "user_secret_file" (include "weir.path.userSecret" .) -}}
{{- $_ = set $admin "table_file" (include "weir.path.table" .) -}}
{{- if .Values.persistTable -}}
{{- $_ = set $admin "state_path" (include "weir.path.state" .) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{- define "weir.tableYaml" -}}
{{- toYaml .Values.table -}}
{{- end -}}

{{/*
Fails the render on settings that would produce a sidecar that cannot work.
*/}}
{{- define "weir.validate" -}}
{{- $inbound := include "weir.portOf" .Values.config.inbound.listen -}}
{{- $admin := include "weir.portOf" .Values.config.admin.listen -}}
{{- $public := include "weir.portOf" .Values.config.admin.public_listen -}}
{{- $app := include "weir.portOf" .Values.config.inbound.app -}}
{{- if or (eq $inbound $admin) (eq $inbound $public) (eq $admin $public) -}}
{{- fail (printf "config: inbound.listen (%s), admin.listen (%s) and admin.public_listen (%s) need distinct ports" $inbound $admin $public) -}}
{{- end -}}
{{- if has $app (list $inbound $admin $public) -}}
{{- fail (printf "config.inbound.app port %s collides with a weir listener" $app) -}}
{{- end -}}
{{- if not (has (toString .Values.sidecar.native) (list "auto" "true" "false")) -}}
{{- fail (printf "sidecar.native: want auto, true or false, got %v" .Values.sidecar.native) -}}
{{- end -}}
{{- if and (eq (toString .Values.sidecar.native) "true") (semverCompare "<1.28.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "sidecar.native=true needs Kubernetes >= 1.28 (native sidecars); this cluster is %s: use auto or false" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{- /*
A value given in values wins; otherwise the value already in the cluster is
kept (lookup), otherwise one is generated. `helm template` cannot look up, so
it renders a fresh random value each time (marked weir.dev/generated).
*/}}
{{- define "weir.secretValue" -}}
{{- $existing := lookup "v1" "Secret" .ns .name -}}
{{- $current := dig "data" .key "" ($existing | default dict) -}}
{{- if .value -}}
{{- .value | b64enc -}}
{{- else if $current -}}
{{- $current -}}
{{- else -}}
{{- randAlphaNum .length | b64enc -}}
{{- end -}}
{{- end -}}

{{/* Injector names and checks. */}}
{{- define "weir.injector.name" -}}{{ include "weir.fullname" . }}-injector{{- end -}}
{{- define "weir.injector.tlsSecretName" -}}{{ include "weir.fullname" . }}-injector-tls{{- end -}}

{{- define "weir.injector.selectorLabels" -}}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/component: injector
{{- end -}}

{{- define "weir.injector.validate" -}}
{{- $tls := .Values.injector.tls -}}
{{- if not $tls.certManager.enabled -}}
{{- if and (or $tls.crt $tls.key $tls.caBundle) (not (and $tls.crt $tls.key $tls.caBundle)) -}}
{{- fail "injector.tls: set crt, key and caBundle together (or none of them to have the chart generate a certificate, or certManager.enabled=true)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Where the injector's certificate comes from: certManager, given (values) or generate. */}}
{{- define "weir.injector.tlsMode" -}}
{{- $tls := .Values.injector.tls -}}
{{- if $tls.certManager.enabled -}}
certManager
{{- else if and $tls.crt $tls.key $tls.caBundle -}}
given
{{- else -}}
generate
{{- end -}}
{{- end -}}
