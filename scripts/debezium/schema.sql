-- The shop's source tables (schemas/shop.pg's comments, schemas/sample/shop/):
-- run.sh creates them before Debezium starts, then seed.sql's rows are the
-- snapshot and changes.sql's are streamed.
CREATE TABLE customers (
    id         integer PRIMARY KEY,
    full_name  text NOT NULL,
    email      text,
    city       text,
    created_at timestamp
);
CREATE TABLE products (
    sku   varchar(32) PRIMARY KEY,
    title text NOT NULL,
    price numeric(10,2)
);
CREATE TABLE orders (
    id          integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES customers (id),
    placed_at   timestamp,
    ship_date   date
);
CREATE TABLE order_lines (
    order_id   integer NOT NULL REFERENCES orders (id),
    product_id varchar(32) NOT NULL,   -- no FK: a product on a line may be deleted (graphsink refuses it)
    quantity   integer NOT NULL,
    PRIMARY KEY (order_id, product_id)
);
