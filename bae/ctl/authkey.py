"""`baectl auth create key`: an admin key pair made locally, no network (BAECTL.md §6).

The hash file is what a server ingests on first boot (BAE_ADMIN_KEY_HASH_FILE);
the plaintext stays with operators.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys

from argon2 import PasswordHasher, Type

from bae.ctl.api import CtlError
from bae.ctl.files import write_file

HASHER = PasswordHasher(time_cost=3, memory_cost=65536, parallelism=1, hash_len=32, salt_len=16, type=Type.ID)


def auth_create_key(args: argparse.Namespace) -> None:
    token = "bae_admin_" + secrets.token_hex(24)
    key_path = os.path.join(args.out_dir, "admin-key.pem")
    hash_path = os.path.join(args.out_dir, "admin-key-hash.pem")
    hashed = {"key_hash": HASHER.hash(token), "name": args.name, "prefix": token[: len("bae_admin_") + 4]}
    for path, content in ((key_path, token + "\n"), (hash_path, json.dumps(hashed, indent=2, sort_keys=True) + "\n")):
        try:
            write_file(path, content, 0o600)
        except OSError as exc:
            raise CtlError(f"could not write {path}: {exc.strerror or exc}") from None
    print(key_path)
    print(hash_path)
    print("baectl: wrote admin key pair.", file=sys.stderr)
    print(f"- {key_path}: the plaintext admin token — LIVE CREDENTIAL, keep it secret; place it where "
          "baectl/operators run (at BAE_ADMIN_KEY_FILE).", file=sys.stderr)
    print(f"- {hash_path}: the Argon2id hash — drop onto every replica's data volume at "
          "BAE_ADMIN_KEY_HASH_FILE before first boot.", file=sys.stderr)
