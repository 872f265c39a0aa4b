from __future__ import annotations

from typing import Any

from django import forms

from dispatch_site.names import is_dns1123_label, is_dns1123_subdomain
from runtimes.models import RuntimeKind, SiteSettings
from runtimes.settings_checks import TRAINER_RELEASES


class AllowListForm(forms.Form):
    kind = forms.ChoiceField(choices=RuntimeKind.choices)
    namespace = forms.CharField(required=False, help_text="only for a TrainingRuntime")
    name = forms.CharField(max_length=253)
    for_jobs = forms.BooleanField(required=False, initial=True, label="jobs")
    for_sessions = forms.BooleanField(required=False, label="interactive sessions")
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not is_dns1123_subdomain(name):
            raise forms.ValidationError("Use a lowercase RFC 1123 name (a-z, 0-9, '-', '.').")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        namespace = (data.get("namespace") or "").strip()
        if data.get("kind") == RuntimeKind.NAMESPACED and not is_dns1123_label(namespace):
            self.add_error("namespace", "A TrainingRuntime needs its namespace (a lowercase RFC 1123 label).")
        if data.get("kind") == RuntimeKind.CLUSTER and namespace:
            self.add_error("namespace", "A ClusterTrainingRuntime has no namespace.")
        if not data.get("for_jobs") and not data.get("for_sessions"):
            self.add_error("for_jobs", "Allow it for jobs, sessions, or both.")
        data["namespace"] = namespace
        return data


class SiteSettingsForm(forms.ModelForm):
    trainer_version = forms.ChoiceField(
        choices=[(v, v) for v in TRAINER_RELEASES],
        label="Trainer version",
        help_text="The installed Kubeflow Trainer release (it decides image placement for MPI runtimes).",
    )

    class Meta:
        model = SiteSettings
        fields = [
            "allow_rank_restart",
            "publish_via",
            "publish_container",
            "label_domain",
            "trainer_version",
            "kueue_default_queues",
            "kueue_priority_classes",
            "max_open_sessions_per_user",
        ]
        labels = {
            "allow_rank_restart": "allowRankRestart (weaker identity guarantee)",
            "kueue_default_queues": "Kueue default queue per namespace",
            "kueue_priority_classes": "Kueue priority classes allowed per namespace",
            "max_open_sessions_per_user": "Open sessions per user",
        }
        help_texts = {
            "kueue_default_queues": 'JSON {"namespace": "local-queue"}; "*" is every other namespace. A job '
            "without queue_name joins its namespace's queue.",
            "kueue_priority_classes": 'JSON {"namespace": ["workload-priority-class", ...]}; "*" is every '
            "other namespace. A job may ask only for a listed class (priority_class).",
        }
        widgets = {
            "kueue_default_queues": forms.Textarea(attrs={"rows": 3}),
            "kueue_priority_classes": forms.Textarea(attrs={"rows": 3}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["max_open_sessions_per_user"].required = False

    def add_field_errors(self, errors: dict[str, Any]) -> None:
        """A serializer's (or the cluster check's) field errors, on the fields they name."""
        for field, messages in errors.items():
            for error in _messages(messages):
                self.add_error(field if field in self.fields else None, error)

    def clean(self) -> dict[str, Any]:
        from runtimes.api import SiteSettingsSerializer

        data = super().clean() or {}
        for name in ("kueue_default_queues", "kueue_priority_classes"):
            if name in data and data[name] is None:  # an emptied field: no entries
                data[name] = {}
        if data.get("max_open_sessions_per_user") is None:  # left out (a page from before the field): kept
            data["max_open_sessions_per_user"] = self.instance.max_open_sessions_per_user
        serializer = SiteSettingsSerializer(self.instance, data=data, partial=True)
        if not serializer.is_valid():
            self.add_field_errors(dict(serializer.errors))
        return data


def _messages(errors: Any, where: str = "") -> list[str]:
    """A serializer's errors as lines; a map's (the Kueue settings per namespace) name their key."""
    if isinstance(errors, dict):
        return [m for key, value in errors.items() for m in _messages(value, f"{where}{key}: ")]
    if isinstance(errors, list):
        return [m for value in errors for m in _messages(value, where)]
    return [f"{where}{errors}"]
