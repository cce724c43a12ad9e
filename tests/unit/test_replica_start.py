"""Replicas starting together on one empty PostgreSQL database: one migrates, one admin key is made."""

from __future__ import annotations

import asyncio

import pytest

from bae.common.ids import token_digest
from bae.services.session.api.admin_key import AdminKeyOptions, bootstrap_admin_key
from bae.services.session.store import Store
from bae.services.session.store import keys
from testkit import REVISIONS, postgres_support

pytestmark = pytest.mark.postgres

REPLICAS = 6
# Each round starts from no active admin key again; without the lock most rounds make several.
ROUNDS = 5


async def test_replicas_starting_at_once_migrate_once_and_make_one_admin_key(tmp_path, request):
    url = postgres_support.server().database_url(request.node.nodeid)
    options = AdminKeyOptions(key_file=tmp_path / "admin-key.pem", hash_file=tmp_path / "absent.json",
                              rotate=False, disabled=False)
    stores = await asyncio.gather(*(Store.open(url) for _ in range(REPLICAS)))
    try:
        assert sorted(len(store.migrations_applied) for store in stores) == [0] * (REPLICAS - 1) + [len(REVISIONS)]
        for _ in range(ROUNDS):
            await asyncio.gather(*(bootstrap_admin_key(store, options) for store in stores))
            admins = await stores[0].read(keys.active_admins)
            assert len(admins) == 1
            # The key in the file is that one.
            token = options.key_file.read_text().strip()
            found = await stores[0].read(keys.active_by_digest, token_digest(token), "admin")
            assert found is not None and found.id == admins[0].id
            await stores[0].write(keys.soft_delete_admins)
            options.key_file.unlink()  # a key file is never replaced: the next key needs the place free
    finally:
        await asyncio.gather(*(store.close() for store in stores))
