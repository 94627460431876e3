"""The outbox pattern: an order and the job that mails it are committed together.

    python examples/outbox.py [URL] [PREFIX]      (default: sqlite:///outbox.db)

Placing an order inserts its row and submits its email job in ONE transaction
of the application's own connection: if the transaction rolls back, neither
exists; if it commits, an executor runs the job at once. The job "sends" the
email (a line appended to outbox.log: at least once, like any side effect
outside the database) and marks the order mailed through
``dbexecutor.transaction()``, so that mark commits exactly when the job's
completion does.
"""

from __future__ import annotations

import sys

from sqlalchemy import Engine, create_engine, make_url, text

import dbexecutor
from dbexecutor import DBExecutor, SubmitRolledBack


# dbexecutor reads postgresql:// as psycopg 3 and mysql:// as PyMySQL; SQLAlchemy's defaults are other drivers.
DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg", "mysql": "mysql+pymysql", "mariadb": "mariadb+pymysql"}


def send_email(orders: str, order_id: int, address: str) -> str:
    """Mail the confirmation, then mark the order mailed in the job's own transaction."""
    with open("outbox.log", "a") as log:  # a real mailer: pass an idempotency key (the order id)
        log.write(f"to {address}: your order {order_id} is confirmed\n")
    with dbexecutor.transaction() as conn:
        conn.execute(text(f"UPDATE {orders} SET mailed = 1 WHERE id = :id"), {"id": order_id})
    return f"mailed {address}"


def place_order(ex: DBExecutor, engine: Engine, orders: str, order_id: int, address: str, commit: bool) -> dbexecutor.JobFuture[str]:
    """Insert the order and submit its email in one transaction; commit it or roll it back."""
    with engine.connect() as conn:
        conn.execute(text(f"INSERT INTO {orders} (id, email, mailed) VALUES (:id, :email, 0)"), {"id": order_id, "email": address})
        fut = ex.options(connection=conn).submit(send_email, orders, order_id, address)
        if commit:
            conn.commit()
        else:
            conn.rollback()
    return fut


def main(url: str, prefix: str) -> None:
    orders = f"{prefix}orders"
    with DBExecutor(url, max_workers=2, prefix=prefix) as ex:
        # The application's engine: any engine on the executor's database will do.
        parsed = make_url(url)
        engine = create_engine(parsed.set(drivername=DRIVERS.get(parsed.drivername, parsed.drivername)))
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {orders}"))
            conn.execute(text(f"CREATE TABLE {orders} (id INTEGER PRIMARY KEY, email VARCHAR(200), mailed INTEGER)"))
        placed = place_order(ex, engine, orders, 1, "ada@example.com", commit=True)
        dropped = place_order(ex, engine, orders, 2, "bob@example.com", commit=False)
        print(placed.result(timeout=60))
        try:
            dropped.result(timeout=10)
        except SubmitRolledBack:
            print("order 2 rolled back: no order row, no email job")
        with engine.connect() as conn:
            for order_id, mailed in conn.execute(text(f"SELECT id, mailed FROM {orders} ORDER BY id")):
                print(f"order {order_id} {'mailed' if mailed else 'not mailed'}")
        engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///outbox.db", sys.argv[2] if len(sys.argv) > 2 else "")
