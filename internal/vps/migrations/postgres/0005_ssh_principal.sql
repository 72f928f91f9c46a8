-- The one SSH certificate principal an instance's guest accepts (its
-- AuthorizedPrincipalsFile, written by the seed at first boot): the
-- instance's id. Guests seeded before it accept any certificate of the
-- deployment's CA made out to the account 'bc', a principal they all share;
-- their rows keep '' and the API signs no certificate for them (recreate
-- them: docs/instances.md). '' is also an instance seeded with no CA.
ALTER TABLE instances ADD COLUMN ssh_principal TEXT NOT NULL DEFAULT '';
