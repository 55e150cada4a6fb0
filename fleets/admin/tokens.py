"""The admin of stored API tokens: create one (its secret shown once, on the page that answers
the creation, never stored or put in a message), see when each was last used, revoke."""

from __future__ import annotations

from django.contrib import admin, messages
from django.template.response import TemplateResponse

from fleets.base import clock
from fleets.core.access import STORED_TOKEN_PREFIX
from fleets.models import ApiToken
from fleets.reads.access import secret_digest
from fleets.services.access import api_token_revoke, new_token_secret

# Where save_model leaves the new secret for response_add, on the request only.
_SECRET_ATTR = "_haru_new_token_secret"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "scope", "all_fleets", "reach", "last_used_at", "revoked_at")
    list_filter = ("scope", "all_fleets", "revoked_at")
    search_fields = ("name", "prefix")
    filter_horizontal = ("fleets",)
    readonly_fields = ("prefix", "created_by", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke_tokens"]

    def get_readonly_fields(self, request, obj=None):
        # A token's reach is fixed at creation: widening one would hand a holder more than was
        # agreed; revoke it and create another.
        if obj is not None:
            return (*self.readonly_fields, "name", "scope", "all_fleets", "fleets")
        return self.readonly_fields

    @admin.display(description="fleets")
    def reach(self, obj):
        return "every fleet" if obj.all_fleets else ", ".join(f.slug for f in obj.fleets.all())

    def save_model(self, request, obj, form, change):
        if not change:
            secret = new_token_secret()
            obj.prefix = secret[: len(STORED_TOKEN_PREFIX) + 7]
            obj.secret_sha256 = secret_digest(secret)
            obj.created_by = request.user
            setattr(request, _SECRET_ATTR, secret)
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, _SECRET_ATTR, None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Token {obj.name} created",
            "token": obj,
            "secret": secret,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/fleets/apitoken/created.html", context)

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke_tokens(self, request, queryset):
        now = clock.now()
        for token in queryset:
            if api_token_revoke(name=token.name, now=now):
                self.message_user(request, f"{token.name}: revoked")
            else:
                self.message_user(request, f"{token.name}: already revoked", messages.WARNING)
