{{/* Release-scoped name: the release name, with the chart name appended unless it is in it. */}}
{{- define "sloline.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sloline.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The operator's objects: Deployment, ServiceAccount, RBAC, settings ConfigMap. */}}
{{- define "sloline.operatorName" -}}
{{- printf "%s-operator" (include "sloline.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sloline.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sloline.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sloline.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "sloline.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sloline
{{- end -}}

{{/* Pods of the operator; the component keeps them apart from pipeline pods, which share
     app.kubernetes.io/name=sloline (docs/kubernetes.md). */}}
{{- define "sloline.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "sloline.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* repository[:tag][@digest]; the tag defaults to the chart's appVersion. */}}
{{- define "sloline.image" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The operator settings file (docs/kubernetes.md "Operator configuration"). */}}
{{- define "sloline.settingsFile" -}}
{{- $image := dict "runtimeImage" (include "sloline.image" (dict "root" . "image" .Values.image.runtime)) "imagePullPolicy" .Values.image.runtime.pullPolicy -}}
{{- $settings := deepCopy .Values.settings -}}
{{- $pods := $settings.pods | default dict -}}
{{- $secrets := concat .Values.imagePullSecrets ($pods.imagePullSecrets | default list) -}}
{{- if $secrets }}{{ $_ := set $pods "imagePullSecrets" $secrets }}{{ end -}}
{{- $_ := set $settings "pods" $pods -}}
{{- toYaml (merge $image $settings) -}}
{{- end -}}

{{/* The admission webhook: its Service, and the cluster-scoped ValidatingWebhookConfiguration
     (named after the release namespace too, so installs in two namespaces do not share it). */}}
{{- define "sloline.webhookService" -}}
{{- printf "%s-webhook" (include "sloline.operatorName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sloline.webhookConfiguration" -}}
{{- printf "%s-%s" (include "sloline.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}
