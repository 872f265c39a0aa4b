"""Access changes are audited however they are made (the `user_access` command, `create_user`, a shell, a
migration): namespace grants given and taken, roles (groups) joined and left, accounts deactivated and
reactivated. The actor is whoever the surrounding `audit.acting_as` names, else "system"."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save
from django.dispatch import receiver

from dispatch_site.audit import audit_record, current_actor
from dispatch_site.models import NamespaceGrant


def _record(action: str, object_type: str, object_id: str, details: dict[str, Any]) -> None:
    actor, name = current_actor()
    audit_record(
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=object_id,
        details=details,
        actor_name=name,
    )


def _holder(grant: NamespaceGrant) -> tuple[str, str]:
    if grant.user_id is not None:
        return "user", grant.user.get_username() if grant.user else str(grant.user_id)
    return "group", grant.group.name if grant.group else str(grant.group_id)


@receiver(post_save, sender=NamespaceGrant, dispatch_uid="audit-grant-add")
def _grant_added(sender: Any, instance: NamespaceGrant, created: bool, raw: bool = False, **_: Any) -> None:
    if created and not raw:
        kind, name = _holder(instance)
        _record("grant.add", kind, name, {"namespace": instance.namespace})


@receiver(post_delete, sender=NamespaceGrant, dispatch_uid="audit-grant-remove")
def _grant_removed(sender: Any, instance: NamespaceGrant, **_: Any) -> None:
    try:
        kind, name = _holder(instance)
    except (User.DoesNotExist, Group.DoesNotExist):  # deleted with its user or group: that is audited
        return
    _record("grant.remove", kind, name, {"namespace": instance.namespace})


@receiver(m2m_changed, sender=User.groups.through, dispatch_uid="audit-role")
def _roles_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: set[int] | None, **_: Any
) -> None:
    if action not in ("post_add", "post_remove", "pre_clear"):
        return
    verb = "role.add" if action == "post_add" else "role.remove"
    if action == "pre_clear":  # clear() sends no pk_set: the members or groups about to go
        pk_set = set(
            instance.user_set.values_list("pk", flat=True)
            if reverse
            else instance.groups.values_list("pk", flat=True)
        )
    if not pk_set:
        return
    if reverse:  # group.user_set.add(users)
        for username in User.objects.filter(pk__in=pk_set).values_list("username", flat=True):
            _record(verb, "user", username, {"role": instance.name})
    else:  # user.groups.add(groups)
        for group in Group.objects.filter(pk__in=pk_set).values_list("name", flat=True):
            _record(verb, "user", instance.get_username(), {"role": group})


@receiver(pre_save, sender=User, dispatch_uid="audit-user-active")
def _activation_changed(
    sender: Any, instance: User, raw: bool = False, update_fields: Any = None, **_: Any
) -> None:
    if raw or instance.pk is None or (update_fields is not None and "is_active" not in update_fields):
        return  # a save that cannot change it (every login saves last_login alone): no read
    was = User.objects.filter(pk=instance.pk).values_list("is_active", flat=True).first()
    if was is not None and was != instance.is_active:
        _record(
            "user.activate" if instance.is_active else "user.deactivate", "user", instance.get_username(), {}
        )
