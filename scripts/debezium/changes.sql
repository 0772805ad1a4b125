-- Changes after the snapshot, streamed from the WAL by pgoutput.
INSERT INTO orders VALUES (101, 2, '2024-12-06 14:26:40', NULL);               -- c
INSERT INTO order_lines VALUES (101, 'p-2', 3);                                -- c
UPDATE orders SET ship_date = '2024-12-10' WHERE id = 101;                    -- u
UPDATE customers SET city = 'Cambridge' WHERE id = 2;                          -- u
INSERT INTO customers VALUES (4, 'Edsger Dijkstra', NULL, NULL, NULL);         -- c, nulls
DELETE FROM customers WHERE id = 3;                                            -- d + tombstone
DELETE FROM products WHERE sku = 'p-3';                                        -- d of a product order 100's line references
DELETE FROM order_lines WHERE order_id = 100 AND product_id = 'p-1';           -- d of an edge
