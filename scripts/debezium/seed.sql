-- Rows present before Debezium starts: its initial snapshot reads them (op "r").
INSERT INTO customers VALUES
    (1, 'Ada Lovelace', 'ada@example.com', 'London', '2023-12-01 00:00:00.123456'),
    (2, 'Grace Hopper', 'grace@example.com', 'Arlington', '2023-12-02 00:00:00'),
    (3, 'Alan Turing', 'alan@example.com', 'Wilmslow', '2023-12-03 00:00:00.5');
INSERT INTO products VALUES
    ('p-1', 'Keyboard', 49.99),
    ('p-2', 'Mouse', 19.50),
    ('p-3', 'USB cable', 5.00);
INSERT INTO orders VALUES (100, 1, '2024-11-30 20:53:20', NULL);
INSERT INTO order_lines VALUES (100, 'p-1', 1), (100, 'p-3', 2);
