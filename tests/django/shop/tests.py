"""ratchet.contrib.django under Django's own test runner (run by tests/django/test_django.py
against SQLite and PostgreSQL). TransactionTestCase: every test commits for real, so the
worker subprocess and the ledger see what the test wrote."""

import os
import signal
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path
from typing import ClassVar

from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import TransactionTestCase

from ratchet import IdempotencyConflict, InvalidArguments, State, TaskNotFound
from ratchet.contrib.django import atomic_connection, get_app, ledger_url, submit
from ratchet.control import Control
from ratchet.testing import wait_for
from shop.models import Order

PROJECT = Path(__file__).resolve().parent.parent


class Boom(Exception):
    pass


def control() -> Control:
    return Control(app=get_app())


class SubmitInAtomic(TransactionTestCase):
    databases: ClassVar[set[str]] = {"default", "other"}

    def test_the_ledger_is_in_the_project_database(self) -> None:
        url = ledger_url()
        name = str(connection.settings_dict["NAME"])
        self.assertIn(os.path.basename(name), url)
        with control() as c:
            self.assertGreater(c.schema_version(), 0)

    def test_ratchet_migrate_reports_the_schema_version(self) -> None:
        out = StringIO()
        call_command("ratchet_migrate", stdout=out)
        with control() as c:
            self.assertIn(f"schema version {c.schema_version()}", out.getvalue())

    def test_commit_writes_the_row_and_the_task_together(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(total_cents=1299)
            handle = submit("fulfil", {"order_id": order.pk},
                            idempotency_key=f"fulfil:{uuid.uuid4()}", delay_s=3600)
        self.assertTrue(handle.created)
        self.assertTrue(Order.objects.filter(pk=order.pk).exists())
        with control() as c:
            task = c.get(handle.task_id)
        self.assertEqual(task.state, State.PENDING)
        self.assertEqual(task.params, {"order_id": order.pk})

    def test_an_exception_rolls_back_both(self) -> None:
        key = f"fulfil:{uuid.uuid4()}"
        with self.assertRaises(Boom), transaction.atomic():
            order = Order.objects.create(total_cents=500)
            handle = submit("fulfil", {"order_id": order.pk}, idempotency_key=key,
                            delay_s=3600)
            raise Boom
        self.assertFalse(Order.objects.filter(total_cents=500).exists())
        with control() as c:
            with self.assertRaises(TaskNotFound):
                c.get(handle.task_id)
            self.assertEqual(c.list_tasks(key=key).tasks, [])

    def test_a_savepoint_rolled_back_takes_its_task_with_it(self) -> None:
        key = f"fulfil:{uuid.uuid4()}"
        with transaction.atomic():
            Order.objects.create(total_cents=700)
            with self.assertRaises(Boom), transaction.atomic():
                submit("fulfil", {"order_id": 0}, idempotency_key=key, delay_s=3600)
                raise Boom
        self.assertTrue(Order.objects.filter(total_cents=700).exists())
        with control() as c:
            self.assertEqual(c.list_tasks(key=key).tasks, [])

    def test_submit_outside_atomic_is_refused_and_writes_nothing(self) -> None:
        key = f"fulfil:{uuid.uuid4()}"
        with self.assertRaisesRegex(InvalidArguments, "transaction.atomic"):
            submit("fulfil", {"order_id": 1}, idempotency_key=key)
        with self.assertRaisesRegex(InvalidArguments, "transaction.atomic"):
            atomic_connection()
        with control() as c:
            self.assertEqual(c.list_tasks(key=key).tasks, [])

    def test_the_same_key_in_a_later_transaction_gets_the_same_task(self) -> None:
        key = f"fulfil:{uuid.uuid4()}"
        with transaction.atomic():
            first = submit("fulfil", {"order_id": 5}, idempotency_key=key, delay_s=3600)
        with transaction.atomic():
            again = submit("fulfil", {"order_id": 5}, idempotency_key=key, delay_s=3600)
        self.assertTrue(first.created)
        self.assertFalse(again.created)
        self.assertEqual(again.task_id, first.task_id)

    def test_a_conflicting_key_leaves_the_transaction_usable(self) -> None:
        key = f"fulfil:{uuid.uuid4()}"
        with transaction.atomic():
            submit("fulfil", {"order_id": 6}, idempotency_key=key, delay_s=3600)
        with transaction.atomic():
            with self.assertRaises(IdempotencyConflict):
                submit("fulfil", {"order_id": 7}, idempotency_key=key, delay_s=3600)
            Order.objects.create(total_cents=606)
        self.assertTrue(Order.objects.filter(total_cents=606).exists())

    def test_a_database_without_the_ledger_is_refused(self) -> None:
        key = f"fulfil:{uuid.uuid4()}"
        with self.assertRaisesRegex(InvalidArguments, "ledger"), \
                transaction.atomic(using="other"):
            submit("fulfil", {"order_id": 1}, idempotency_key=key, using="other")
        with control() as c:
            self.assertEqual(c.list_tasks(key=key).tasks, [])

    def test_connection_argument_is_refused(self) -> None:
        with self.assertRaisesRegex(InvalidArguments, "using="), transaction.atomic():
            submit("fulfil", {"order_id": 1}, connection=object())


class Worker(TransactionTestCase):
    def test_manage_py_ratchet_worker_runs_the_task_and_stops_on_sigterm(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(total_cents=4200)
            handle = submit("fulfil", {"order_id": order.pk})
        env = {**os.environ, "DJ_DB_NAME": str(connection.settings_dict["NAME"])}
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "ratchet_worker", "--concurrency", "2",
             "--shutdown-grace-s", "5"],
            cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            with control() as c:
                done = wait_for(f"task {handle.task_id} to succeed",
                                lambda: (t := c.get(handle.task_id)).state is State.SUCCEEDED
                                and t, timeout_s=60)
            self.assertEqual(done.result, {"order_id": order.pk})
            order.refresh_from_db()
            self.assertEqual(order.status, "fulfilled")
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            self.assertEqual(proc.returncode, 0, out)
            self.assertIn("ratchet worker", out)
            self.assertIn("stopped", out)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


class AdminPage(TransactionTestCase):
    URL = "/admin/ratchet/tasks/"

    def setUp(self) -> None:
        with transaction.atomic():
            self.handle = submit("fulfil", {"order_id": 99}, delay_s=3600)

    def test_staff_see_counts_and_dashboard_links(self) -> None:
        staff = User.objects.create_user("ops", password="pw-ops", is_staff=True)
        self.client.force_login(staff)
        response = self.client.get(self.URL)
        self.assertEqual(response.status_code, 200)
        html = response.content.decode()
        self.assertIn('data-state="PENDING"', html)
        self.assertGreaterEqual(dict(response.context["totals"])["PENDING"], 1)
        link = f"http://dash.example:8080/tasks/{self.handle.task_id}"
        self.assertIn(f'href="{link}"', html)
        self.assertIn("fulfil", html)

        index = self.client.get("/admin/")
        self.assertEqual(index.status_code, 200)
        self.assertIn(f'href="{self.URL}"', index.content.decode())

        filtered = self.client.get(self.URL, {"state": "SUCCEEDED"})
        self.assertEqual(filtered.status_code, 200)
        self.assertNotIn(link, filtered.content.decode())
        self.assertEqual(filtered.context["chosen"], "SUCCEEDED")

    def test_anonymous_and_non_staff_are_sent_to_login(self) -> None:
        response = self.client.get(self.URL)
        self.assertEqual(response.status_code, 302)
        self.assertIn("/admin/login/", response["Location"])
        User.objects.create_user("shopper", password="pw-shopper", is_staff=False)
        self.client.login(username="shopper", password="pw-shopper")
        response = self.client.get(self.URL)
        self.assertEqual(response.status_code, 302)
        self.assertIn("/admin/login/", response["Location"])
